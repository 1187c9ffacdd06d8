-- asynccoord schema version 4 (PostgreSQL): the conflict monitor's cluster-wide counters.
-- Same tables as the SQLite dialect (see sql/sqlite/migration_0004.sql): per 1-second
-- bucket counts and latency histogram slots, lifetime totals per process, the processes
-- that flushed and the firing alerts of each live monitor. scope is '' for a process'
-- own total and a node id for a per-node breakdown of it.
CREATE TABLE coord_metric_counts (
    bucket_s   bigint NOT NULL,
    process_id text   NOT NULL,
    scope      text   NOT NULL,
    name       text   NOT NULL,
    value      bigint NOT NULL,
    PRIMARY KEY (bucket_s, process_id, scope, name)
);

-- slot is the histogram bucket index (asynccoord/histogram.py); slot -1 holds the total
-- count and sum_ms of the observations, the other slots their count only.
CREATE TABLE coord_metric_latency (
    bucket_s   bigint           NOT NULL,
    process_id text             NOT NULL,
    name       text             NOT NULL,
    slot       integer          NOT NULL,
    count      bigint           NOT NULL,
    sum_ms     double precision NOT NULL,
    PRIMARY KEY (bucket_s, process_id, name, slot)
);

CREATE TABLE coord_metric_totals (
    process_id text             NOT NULL,
    scope      text             NOT NULL,
    name       text             NOT NULL,
    value      bigint           NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (process_id, scope, name)
);
CREATE INDEX coord_metric_totals_age ON coord_metric_totals (updated_at);

CREATE TABLE coord_metric_processes (
    process_id     text             PRIMARY KEY,
    info           text             NOT NULL,
    first_flush_at double precision NOT NULL,
    last_flush_at  double precision NOT NULL
);

CREATE TABLE coord_alerts (
    monitor_id text             NOT NULL,
    rule       text             NOT NULL,
    scope_key  text             NOT NULL,
    alert      text             NOT NULL,
    seen_at    double precision NOT NULL,
    expires_at double precision NOT NULL,
    PRIMARY KEY (monitor_id, rule, scope_key)
);
