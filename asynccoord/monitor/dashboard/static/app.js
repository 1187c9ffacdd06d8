// The asynccoord dashboard page: keeps the state the server streams (server-sent events) and
// draws it. Every value is written with textContent (never parsed as HTML).
"use strict";
(function () {
  const HISTORY_MAX_DEFAULT = 600;
  const token = new URLSearchParams(location.search).get("token");
  const tokenQuery = token ? "?token=" + encodeURIComponent(token) : "";
  const state = { sections: {}, seq: -1 };
  const charts = new Map(); // queue name -> uPlot (the busiest queues, as the last history point names them)
  let totalChart = null;
  let latencyChart = null;

  const $ = (id) => document.getElementById(id);

  function fmtS(v) {
    if (v === null || v === undefined) return "-";
    if (v < 1) return (v * 1000).toFixed(0) + " ms";
    if (v < 120) return v.toFixed(1) + " s";
    if (v < 7200) return (v / 60).toFixed(1) + " min";
    return (v / 3600).toFixed(1) + " h";
  }

  function fmtNum(v) {
    if (v === null || v === undefined) return "-";
    return Number.isInteger(v) ? String(v) : String(Math.round(v * 1000) / 1000);
  }

  function cell(row, text, key, cls) {
    const td = document.createElement("td");
    td.textContent = text;
    if (key) td.dataset.k = key;
    if (cls) td.className = cls;
    row.appendChild(td);
    return td;
  }

  function fill(table, items, build, emptyText) {
    const body = $(table).tBodies[0];
    const rows = [];
    for (const item of items) {
      const tr = document.createElement("tr");
      build(tr, item);
      rows.push(tr);
    }
    if (!rows.length && emptyText) {
      const tr = document.createElement("tr");
      const td = cell(tr, emptyText, null, "empty");
      td.colSpan = $(table).tHead.rows[0].cells.length;
      rows.push(tr);
    }
    body.replaceChildren(...rows);
  }

  function infoText(info, skip) {
    return Object.keys(info).sort().filter((k) => !skip.includes(k))
      .map((k) => k + "=" + (typeof info[k] === "string" ? info[k] : JSON.stringify(info[k]))).join(", ");
  }

  // Info keys the processes table shows in columns of its own (or that only serve status).
  const SHOWN_WITH_PROCESS = ["host", "pid", "runtime", "keepalive_s", "nodes"];
  const STATE_TEXT = { live: "live", no_live_node: "no live node", gone: "gone" };
  const GONE_SHOWN = 10;

  // The processes that report: live first, then the gone ones heard last (at most GONE_SHOWN), as status prints them.
  function renderProcesses(processes) {
    const of = (state) => processes.filter((p) => p.state === state);
    const gone = of("gone").sort((a, b) => a.last_flush_age_s - b.last_flush_age_s);
    const counts = [of("live").length + " live"];
    if (of("no_live_node").length) counts.push(of("no_live_node").length + " without a live node");
    if (gone.length) counts.push(gone.length + " gone");
    $("process-count").textContent = "(" + counts.join(", ") + ")";
    fill("processes", [...of("live"), ...of("no_live_node"), ...gone.slice(0, GONE_SHOWN)], (tr, p) => {
      tr.dataset.process = p.process_id;
      tr.className = "state-" + p.state;
      cell(tr, p.process_id, "process_id", "text");
      cell(tr, STATE_TEXT[p.state] || p.state, "state");
      const hosts = p.info.nodes;
      cell(tr, Number.isInteger(hosts) ? p.nodes + "/" + hosts : String(p.nodes), "nodes");
      cell(tr, fmtS(p.last_flush_age_s) + " ago", "last_flush");
      cell(tr, p.info.host === undefined ? "-" : String(p.info.host), "host", "text");
      cell(tr, p.info.pid === undefined ? "-" : String(p.info.pid), "pid");
    }, "no process reports its counters (each process needs a Monitor; python -m asynccoord run has one)");
    setNote("processes-note", gone.length
      ? (gone.length > GONE_SHOWN ? "The " + GONE_SHOWN + " of " + gone.length + " gone processes heard last. " : "") +
        "gone: no live node, and shut down or silent past its keepalive (store clock); its counts stay in the totals for a day."
      : "");
  }

  // A note shown only while it has a text.
  function setNote(id, text) {
    const note = $(id);
    note.hidden = !text;
    note.textContent = text;
  }

  // What the server left out of the lists (section "shown"): the busiest queues are listed.
  function renderShown(shown) {
    setNote("queues-note", shown && shown.queues < shown.queues_total
      ? "The " + shown.queues + " queues with the most tasks pending, claimed or dead, of " + shown.queues_total +
        " (the totals above count them all)."
      : "");
    setNote("limits-note", shown && shown.rate_limit_queues < shown.rate_limit_queues_total
      ? "The limits of " + shown.rate_limit_queues + " of the " + shown.rate_limit_queues_total +
        " queues that declare some: those listed above and those holding keys back."
      : "");
  }

  function renderStatus(s) {
    $("db").textContent = s.db || "";
    const t = s.tasks;
    // "claimed" is the report's "running": leased to a node, sending or still waiting for its lock.
    $("summary").textContent = "tasks " + t.total + " (pending " + t.pending + ", claimed " + t.running +
      ", done " + t.done + ", dead " + t.dead + ") \u00b7 partitions " + s.partitions;
    $("summary").dataset.total = t.total;
    fill("queues", s.queues, (tr, q) => {
      tr.dataset.queue = q.queue;
      cell(tr, q.queue, "queue");
      for (const k of ["pending", "running", "expired_leases", "done", "dead", "total"]) cell(tr, String(q[k]), k);
      cell(tr, fmtS(q.oldest_pending_age_s), "oldest_pending_age_s");
    }, "no tasks");
    fill("dead", s.queues, (tr, q) => {
      tr.dataset.queue = q.queue;
      cell(tr, q.queue, "queue");
      cell(tr, String(q.dead), "dead");
      // "hold": the conversation of each dead task waits until it is requeued or discarded
      cell(tr, q.dead_letter_policy ?? "-", "dead_letter_policy");
    }, "no queues");
    const shortest = s.events.windows[0];
    $("dead-rate").textContent = shortest
      ? "dead-lettered in the last " + shortest.window_s + " s: " + (shortest.counts.dead_lettered || 0) +
        " \u00b7 retries: " + (shortest.counts.retries || 0)
      : "";
    renderProcesses(s.processes || []);
    // Grouped by process, as status prints them: the process, else the runtime the heartbeat names.
    const group = (n) => n.process_id || (typeof n.info.runtime === "string" ? n.info.runtime : "-");
    const nodes = [...s.nodes].sort((a, b) => group(a).localeCompare(group(b)) || a.node_id.localeCompare(b.node_id));
    const groups = new Set(nodes.map(group)).size;
    $("node-count").textContent = "(" + nodes.length + (groups > 1 ? " in " + groups + " processes" : "") + ")";
    let previous = null;
    fill("nodes", nodes, (tr, n) => {
      tr.dataset.node = n.node_id;
      const process = group(n);
      if (previous !== null && process !== previous) tr.className = "group-start";
      cell(tr, process !== previous ? process : "", "process", "text");
      previous = process;
      cell(tr, n.node_id, "node_id", "text");
      cell(tr, typeof n.info.queue === "string" ? n.info.queue : "-", "queue");
      cell(tr, String(n.partitions), "partitions");
      cell(tr, fmtS(n.heartbeat_age_s), "heartbeat_age_s");
      const skip = n.process_id ? SHOWN_WITH_PROCESS : [];
      cell(tr, infoText(n.info, ["queue", ...skip]), "info", "text");
    }, "no live node");
    // Places in line (asynccoord.contract.locks.PLACE_PREFIX) mark a process waiting for a taken lock: counted apart, as status does.
    const places = s.locks.filter((l) => l.name.startsWith("asynccoord.next:")).length;
    $("lock-count").textContent = "(" + (s.locks.length - places) + ")" + (places ? " and places in line (" + places + ")" : "");
    fill("locks", s.locks, (tr, l) => {
      tr.dataset.lock = l.name;
      cell(tr, l.name, "name", "text");
      cell(tr, l.holder || "-", "holder", "text");
      cell(tr, String(l.fencing_token), "fencing_token");
      cell(tr, String(l.permits), "permits");
      cell(tr, fmtS(l.ttl_left_s), "ttl_left_s");
    }, "no lock held");
    // A lock store whose prefix holds nothing while others hold lock keys: likely the wrong --lock-prefix.
    const hint = s.lock_store && s.lock_store.prefix_hint;
    setNote("lock-prefix-hint", hint ? hint.message : "");
    // An alert muted by another rule's (muted, inhibited_by) is a consequence of that incident:
    // listed after the firing ones as "muted by", never counted as firing (as status shows it).
    const firing = s.alerts.filter((a) => !a.muted);
    const muted = s.alerts.filter((a) => a.muted);
    $("alert-count").textContent = "(" + firing.length + ")" + (muted.length ? " and muted (" + muted.length + ")" : "");
    fill("alerts", firing.concat(muted), (tr, a) => {
      tr.className = a.muted ? "muted-alert" : "firing";
      tr.dataset.rule = a.rule;
      const rel = a.relative_to !== null;
      cell(tr, a.muted ? a.rule + " (muted by " + a.inhibited_by + ")" : a.rule, "rule");
      cell(tr, a.event, "event");
      cell(tr, rel ? (a.value * 100).toFixed(1) + " %" : fmtNum(a.value), "value");
      cell(tr, rel ? (a.threshold * 100).toFixed(1) + " %" : fmtNum(a.threshold), "threshold");
      cell(tr, a.window_s + " s", "window_s");
      cell(tr, a.scope + (a.scope_key ? " " + a.scope_key : ""), "scope");
      cell(tr, fmtS(Math.max(0, s.now_s - a.fired_at)), "firing_for");
    }, "no alert firing");
    const totals = s.events.totals;
    fill("events", Object.keys(totals).sort(), (tr, name) => {
      tr.dataset.event = name;
      cell(tr, name, "event");
      cell(tr, String(totals[name]), "total");
    }, "no events flushed");
  }

  function renderResolved(resolved, now) {
    fill("resolved", resolved || [], (tr, a) => {
      tr.dataset.rule = a.rule;
      cell(tr, a.rule, "rule");
      cell(tr, a.event, "event");
      cell(tr, a.scope + (a.scope_key ? " " + a.scope_key : ""), "scope");
      cell(tr, fmtS(Math.max(0, now - a.fired_at)) + " ago", "fired");
      cell(tr, fmtS(Math.max(0, now - a.resolved_at)) + " ago", "resolved");
    }, "none resolved since the page's server started");
  }

  // The status report's rate_limits: per queue its declared limits and the buckets with no
  // token now (longest wait first, as status lists them).
  function renderRateLimits(rl) {
    const queues = rl && Array.isArray(rl.queues) ? rl.queues : [];
    $("rate-limits-none").hidden = queues.length > 0;
    $("rate-limits").hidden = queues.length === 0;
    const held = queues.flatMap((q) => q.held.map((b) => ({ queue: q.queue, ...b })));
    held.sort((a, b) => b.wait_s - a.wait_s || a.queue.localeCompare(b.queue) ||
      a.dimension.localeCompare(b.dimension) || a.key.localeCompare(b.key));
    $("held-count").textContent = queues.length ? "(" + held.length + ")" : "";
    fill("held", held, (tr, b) => {
      tr.dataset.queue = b.queue;
      cell(tr, b.queue, "queue");
      cell(tr, b.dimension, "dimension");
      cell(tr, b.key, "key");
      const td = cell(tr, fmtS(b.wait_s), "wait");
      td.dataset.s = String(b.wait_s);
    }, "no bucket is holding keys back");
    const limits = queues.flatMap((q) => q.limits.map((l) => ({ queue: q.queue, ...l })));
    fill("limits", limits, (tr, l) => {
      cell(tr, l.queue, "queue");
      cell(tr, l.dimension, "dimension");
      cell(tr, l.count + "/" + fmtNum(l.per_s) + "s", "rate");
      cell(tr, String(l.burst), "burst");
    }, "none declared");
  }

  // The time axis: ticks at least 90 px apart, as HH:MM:SS (uPlot's default labels ran into each
  // other on a narrow chart); value axes wide enough for their labels and their titles.
  const TIME_AXIS = {
    space: 90,
    values: (u, ticks) => ticks.map((t) => new Date(t * 1000).toTimeString().slice(0, 8)),
  };
  const VALUE_AXIS_SIZE = 64;

  function chartWidth(el) {
    return Math.max(320, (el.clientWidth || 520) - 4);
  }

  function countsChart(box) {
    return new uPlot({
      width: chartWidth(box), height: 220,
      scales: { x: { time: true }, n: { auto: true }, r: { auto: true } },
      axes: [
        TIME_AXIS,
        { scale: "n", label: "tasks", size: VALUE_AXIS_SIZE },
        { scale: "r", side: 1, label: "finished / s", size: VALUE_AXIS_SIZE, grid: { show: false } },
      ],
      series: [
        {},
        { label: "pending", scale: "n", stroke: "#3367d6", width: 2 },
        { label: "claimed", scale: "n", stroke: "#e8a317", width: 2 },
        { label: "dead", scale: "n", stroke: "#b3261e", width: 2 },
        { label: "finished/s", scale: "r", stroke: "#1e7b34", width: 2, dash: [6, 3] },
      ],
    }, [[], [], [], [], []], box);
  }

  function countsData(pts, counts) {
    return [
      pts.map((p) => p.at),
      pts.map((p) => counts(p).pending),
      pts.map((p) => counts(p).running),
      pts.map((p) => counts(p).dead),
      pts.map((p) => counts(p).finished_per_s),
    ];
  }

  function queueChart(name) {
    let chart = charts.get(name);
    if (chart) return chart;
    const box = document.createElement("div");
    box.className = "chart";
    box.dataset.queue = name;
    const title = document.createElement("h3");
    title.textContent = name;
    box.appendChild(title);
    $("queue-charts").appendChild(box);
    chart = countsChart(box);
    charts.set(name, chart);
    return chart;
  }

  function renderCharts(history, windows) {
    const withTotal = history.filter((p) => p.total);
    if (!totalChart) totalChart = countsChart($("total-chart"));
    totalChart.setData(countsData(withTotal, (p) => p.total));
    // A chart for each queue the last point charts (the busiest now), over the points that have it.
    const newest = history.length ? history[history.length - 1] : null;
    const names = new Set(newest ? Object.keys(newest.queues) : []);
    for (const [name, chart] of charts) {
      if (names.has(name)) continue;
      chart.destroy();
      const box = document.querySelector('.chart[data-queue="' + CSS.escape(name) + '"]');
      if (box) box.remove();
      charts.delete(name);
    }
    const added = [...names].some((name) => !charts.has(name));
    for (const name of names) {
      queueChart(name).setData(countsData(history.filter((p) => p.queues[name]), (p) => p.queues[name]));
    }
    if (added) { // keep the charts in name order
      const boxes = [...$("queue-charts").children].sort((a, b) => a.dataset.queue.localeCompare(b.dataset.queue));
      $("queue-charts").replaceChildren(...boxes);
    }
    const lat = history.filter((p) => p.latency);
    if (!latencyChart) {
      const box = $("latency-chart");
      latencyChart = new uPlot({
        width: chartWidth(box), height: 220,
        scales: { x: { time: true } },
        axes: [TIME_AXIS, { label: "ms", size: VALUE_AXIS_SIZE }],
        series: [
          {},
          { label: "p50", stroke: "#1e7b34", width: 2 },
          { label: "p90", stroke: "#e8a317", width: 2 },
          { label: "p99", stroke: "#b3261e", width: 2 },
        ],
      }, [[], [], [], []], box);
    }
    latencyChart.setData([
      lat.map((p) => p.at), lat.map((p) => p.latency.p50_ms), lat.map((p) => p.latency.p90_ms), lat.map((p) => p.latency.p99_ms),
    ]);
    // The newest snapshot's figures: an older point's would quote commits that have left every window.
    const last = history.length ? history[history.length - 1].latency : null;
    const longest = Math.max(0, ...windows);
    $("latency-window").textContent = last
      ? "(last " + last.window_s + " s: p50 " + fmtNum(last.p50_ms) + " ms, p99 " + fmtNum(last.p99_ms) + " ms, " +
        last.count + " commits)"
      : lat.length && longest ? "(no commits in the last " + longest + " s)" : "(no commits measured yet)";
  }

  function render() {
    const sec = state.sections;
    const error = $("error");
    // A lock store that cannot be read hides its locks only: the rest of the status is shown under the banner.
    const lockError = sec.status && sec.status.lock_store && sec.status.lock_store.error;
    const banner = sec.error || (lockError ? "lock store unreachable: " + lockError : "");
    error.hidden = !banner;
    error.textContent = banner;
    if (sec.status) {
      renderStatus(sec.status);
      renderResolved(sec.resolved, sec.status.now_s);
      renderRateLimits(sec.status.rate_limits);
    }
    renderShown(sec.shown);
    renderCharts(sec.history || [], sec.status ? sec.status.events.windows.map((w) => w.window_s) : []);
    document.body.dataset.seq = String(state.seq);
    document.body.dataset.ready = sec.status ? "1" : "0";
  }

  function apply(message) {
    if (message.type === "state") {
      state.sections = message.sections;
    } else if (message.type === "change") {
      for (const [name, value] of Object.entries(message.sections)) {
        if (name === "history") {
          const history = (state.sections.history || []).concat(value);
          const settings = state.sections.settings || {};
          state.sections.history = history.slice(-(settings.history || HISTORY_MAX_DEFAULT));
        } else {
          state.sections[name] = value;
        }
      }
    }
    state.seq = message.seq;
    render();
  }

  function connect() {
    const source = new EventSource("api/stream" + tokenQuery);
    const pill = $("connection");
    source.onopen = () => { pill.textContent = "live"; pill.className = "pill live"; };
    source.onerror = () => { pill.textContent = "reconnecting"; pill.className = "pill down"; };
    source.onmessage = (event) => apply(JSON.parse(event.data));
  }

  window.addEventListener("resize", () => {
    for (const [name, chart] of charts) {
      const box = document.querySelector('.chart[data-queue="' + CSS.escape(name) + '"]');
      if (box) chart.setSize({ width: chartWidth(box), height: 220 });
    }
    if (totalChart) totalChart.setSize({ width: chartWidth($("total-chart")), height: 220 });
    if (latencyChart) latencyChart.setSize({ width: chartWidth($("latency-chart")), height: 220 });
  });
  connect();
})();
