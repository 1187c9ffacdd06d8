"""A job longer than its lock's TTL, kept safe by the watchdog; and a hung job stopped by ``max_hold_s``.

1. A nightly report job holds ``Lock(store, "report:nightly", ttl_s=0.6, renew_interval_s=0.2)``
   for 1.6 s: the store's watchdog renews the 0.6 s lease every 0.2 s, so the lease (and its
   fencing token) outlives the TTL, and a second contender cannot get the lock meanwhile.
   When the job is done, the next holder gets it, with a higher fencing token.
2. A hung job (it never returns) under ``max_hold_s=1.0``: the watchdog stops renewing at
   the ceiling, cancels the block and ``async with`` raises ``MaxHoldExceededError``.

Exits 0 only if all of that happened. Run:  python examples/long_job_lock.py
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time

from asynccoord import Lock, LockTimeoutError, MaxHoldExceededError, SQLiteStore


async def contender(store: SQLiteStore, name: str, tries: int) -> int:
    """Try to take ``name`` ``tries`` times while the job runs; return how many attempts got it."""
    got = 0
    for _ in range(tries):
        await asyncio.sleep(0.3)
        try:
            async with Lock(store, name, ttl_s=0.6, timeout_s=0.1, holder="contender"):
                got += 1
        except LockTimeoutError as exc:
            print(f"  contender: busy ({exc})")
    return got


async def main() -> int:
    with tempfile.TemporaryDirectory() as folder:
        async with SQLiteStore(os.path.join(folder, "jobs.db")) as store:
            name = "report:nightly"
            job = Lock(store, name, ttl_s=0.6, renew_interval_s=0.2, holder="report-job")
            started = time.monotonic()
            async with job as lease:
                print(f"job: acquired {lease!r}")
                rival = asyncio.create_task(contender(store, name, tries=3))
                for step in range(4):  # 4 x 0.4 s of work: 2.7 times the TTL
                    await asyncio.sleep(0.4)
                    (info,) = await store.list_locks(name)
                    print(
                        f"  job step {step}: held {time.monotonic() - started:.1f} s, fencing token "
                        f"{info.fencing_token}, holder {info.holder!r}, TTL left {info.remaining_ttl_s:.2f} s"
                    )
                contender_wins = await rival  # (every attempt made while the job holds the lock)
            stats = job.watchdog.statistics()
            print(f"job: done in {time.monotonic() - started:.1f} s; watchdog renewed it {stats.renewed} times")
            async with Lock(store, name, ttl_s=0.6, timeout_s=1.0, holder="next") as after:
                print(f"after the job: the next holder gets fencing token {after.fencing_token}")

            hung = Lock(store, "sync:inbox", ttl_s=0.6, renew_interval_s=0.2, max_hold_s=1.0, holder="hung-job")
            started = time.monotonic()
            stopped_by: BaseException | None = None
            try:
                async with hung:
                    await asyncio.sleep(3600)  # a job that never finishes
            except MaxHoldExceededError as exc:
                stopped_by = exc
            held_s = time.monotonic() - started
            print(f"hung job: cancelled after {held_s:.2f} s with {type(stopped_by).__name__}: {stopped_by}")
            left = await store.list_locks("sync:inbox")
            print(f"hung job: lock released: {not left}")

    ok = (
        contender_wins == 0
        and lease.fencing_token < after.fencing_token
        and stats.renewed >= 5
        and isinstance(stopped_by, MaxHoldExceededError)
        and 0.9 <= held_s < 2.5
        and not left
    )
    print(f"long job kept its lock, contender refused, hung job stopped at max_hold_s: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
