"""Which schema a database holds, and the refusal of one this asynccoord cannot use.

Each dialect's schema is ``sql/migration_0001.sql`` beside its store, plus any later
``migration_NNNN.sql`` (see :mod:`.sqlfiles`); a database records the number of the last
one applied under ``coord_meta.schema_revision``. The development history before 0.1.0
(never released) was squashed into ``migration_0001.sql``: a database made by that
history records ``coord_meta.schema_version`` instead, and is refused rather than
upgraded (its data was only ever test data), with the fix in the message: delete the
SQLite file, or drop the PostgreSQL schema.
"""

from __future__ import annotations

from ..errors import SchemaVersionError

__all__ = ("PRE_RELEASE_KEY", "REVISION_KEY", "check_partitions", "check_revision")

REVISION_KEY = "schema_revision"
"""``coord_meta`` key of the number of the last migration applied (``migration_NNNN.sql``)."""
PRE_RELEASE_KEY = "schema_version"
"""``coord_meta`` key that only a database made before the schema was squashed holds."""


def check_revision(where: str, meta: dict[str, str], *, supported: int, fix: str) -> int:
    """The schema revision ``meta`` records, once it is one this asynccoord can open.

    Args:
        where: The database, as messages name it (the store's repr, or the file's).
        meta: The database's ``coord_meta`` rows, key -> value (at least those of
            :data:`REVISION_KEY` and :data:`PRE_RELEASE_KEY`; empty for a new database).
        supported: The highest revision this asynccoord knows (its number of migrations).
        fix: What removes a pre-release database, e.g. ``"delete the file 'x.db'"``.

    Returns:
        The recorded revision; 0 when none is recorded (a new database: nothing applied).

    Raises:
        SchemaVersionError: the database was made by a pre-release schema (it records a
            ``schema_version`` and no revision), or by a newer asynccoord, or the revision
            it records is no number (an altered or damaged ``coord_meta``).
    """
    revision = meta.get(REVISION_KEY)
    pre_release = meta.get(PRE_RELEASE_KEY)
    if revision is None and pre_release is not None:
        raise SchemaVersionError(
            f"{where} was made by a development version of asynccoord before 0.1.0 (schema version "
            f"{pre_release} of the unreleased history), which this asynccoord cannot read or upgrade: "
            f"{fix}, and open it again to start with an empty store"
        )
    if revision is not None and not (revision.isascii() and revision.isdigit()):
        raise SchemaVersionError(
            f"{where} records schema revision {revision!r} in its coord_meta table, which is no revision "
            "number: the database was altered or damaged; restore it from a backup"
            + (f", or {fix} to start with an empty store" if fix else "")
        )
    number = int(revision or 0)
    if number > supported:
        raise SchemaVersionError(
            f"{where} has schema version {number}, newer than {supported} which this asynccoord "
            "understands: upgrade asynccoord"
        )
    return number


def check_partitions(where: str, value: object) -> int:
    """The partition count a database's ``coord_meta`` records (``value``, its text or number).

    Raises:
        SchemaVersionError: it is no positive whole number (an altered or damaged ``coord_meta``).
    """
    text = str(value)
    if not (text.isascii() and text.isdigit() and int(text) > 0):
        raise SchemaVersionError(
            f"{where} records {text!r} as its partition count in its coord_meta table, which is no "
            "partition count: the database was altered or damaged; restore it from a backup"
        )
    return int(text)
