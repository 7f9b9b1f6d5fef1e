// The quorumlog dashboard's live parts: every few seconds, /api/overview refreshes the numbers the server
// rendered into the page and redraws the two charts as inline SVG. Text from the cluster goes into the page
// through textContent only (never as HTML): bookie ids and payloads are not trusted markup.
"use strict";
(function () {
  const REFRESH_MS = 2000;
  const SVG = "http://www.w3.org/2000/svg";

  function fmt(x, digits) {
    if (x === null || x === undefined || !isFinite(x)) return "–";
    return Number(x).toLocaleString("en-US", { minimumFractionDigits: digits || 0, maximumFractionDigits: digits || 0 });
  }
  function bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let v = n, i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
    return i === 0 ? v + " B" : v.toFixed(1) + " " + units[i];
  }
  function setText(id, text) {
    const el = document.getElementById(id);
    if (el) el.textContent = text;
  }
  function cell(tr, text) {
    const td = document.createElement("td");
    td.textContent = text;
    tr.appendChild(td);
  }

  function renderBookies(bookies) {
    const tbody = document.querySelector("#bookies tbody");
    if (!tbody) return;
    const rows = bookies.map(function (b) {
      const tr = document.createElement("tr");
      tr.className = "state-" + b.state.replace(" ", "-");
      cell(tr, b.bookie_id);
      cell(tr, b.address || "–");
      cell(tr, b.state);
      cell(tr, b.disk_used_ratio === null ? "–" : (b.disk_used_ratio * 100).toFixed(1) + "%");
      cell(tr, bytes(b.free_bytes));
      cell(tr, fmt(b.adds_total));
      cell(tr, fmt(b.adds_per_s, 1));
      cell(tr, fmt(b.add_p99_ms, 2));
      cell(tr, fmt(b.connections));
      cell(tr, b.metrics ? "yes" : "unavailable: " + b.metrics_error);
      return tr;
    });
    tbody.replaceChildren.apply(tbody, rows);
  }

  // A table (or the "none" line when there are no rows) replacing the element with that id. A cell is a
  // string, or {text, href} for a link.
  function replaceTable(id, headers, rows) {
    const old = document.getElementById(id);
    if (!old) return;
    let el;
    if (!rows.length) {
      el = document.createElement("p");
      el.className = "empty";
      el.textContent = "none";
    } else {
      el = document.createElement("table");
      const head = el.createTHead().insertRow();
      headers.forEach(function (h) {
        const th = document.createElement("th");
        th.textContent = h;
        head.appendChild(th);
      });
      const body = el.createTBody();
      rows.forEach(function (row) {
        const tr = body.insertRow();
        row.forEach(function (c) {
          const td = tr.insertCell();
          if (c !== null && typeof c === "object") {
            const a = document.createElement("a");
            a.href = c.href;
            a.textContent = c.text;
            td.appendChild(a);
          } else {
            td.textContent = c;
          }
        });
      });
    }
    el.id = id;
    old.replaceWith(el);
  }

  function renderRecovery(r) {
    const facts = document.querySelectorAll("#recovery table.facts td");
    if (facts.length >= 4) {
      facts[0].textContent = r.auditor || "none elected";
      facts[1].textContent = r.lost_bookie_recovery_delay_s === null
        ? "not set (auditors use their configured default)" : r.lost_bookie_recovery_delay_s + " s";
      facts[2].textContent = r.replication_enabled === null ? "–" : (r.replication_enabled ? "enabled" : "DISABLED");
      facts[3].textContent = String(r.under_replicated_count);
    }
    replaceTable("under-replicated", ["ledger", "missing replicas", "progress"], r.under_replicated.map(function (u) {
      return [
        { text: String(u.ledger_id), href: "/ledger/" + encodeURIComponent(u.ledger_id) },
        u.missing.join(", ") || "–",
        u.replicating ? "being re-replicated by " + u.replicating : "waiting for a worker",
      ];
    }));
    replaceTable("processes", ["process", "role", "ledgers re-replicated", "entries copied", "bytes copied",
      "failures", "in progress", "last error"], r.processes.map(function (p) {
      const role = [p.auditor_elected ? "auditor" : "", p.worker ? "worker" : ""].filter(Boolean).join(" + ");
      return [p.owner, role || "candidate", String(p.ledgers_replicated), String(p.entries_copied),
        bytes(p.bytes_copied), String(p.failures), p.in_progress.join(", ") || "–", p.last_error || "–"];
    }));
  }

  // A line chart: series = [{name, points: [[t, y], ...]}], drawn into a 600x160 viewBox.
  function drawChart(svg, series, unit) {
    if (!svg) return;
    // Drawn in the element's own pixels, so text and lines are not stretched with the page's width.
    const W = Math.max(200, Math.round(svg.getBoundingClientRect().width) || 600), H = 160, L = 44, B = 16, T = 6;
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    let tMin = Infinity, tMax = -Infinity, yMax = 0;
    series.forEach(function (s) {
      s.points.forEach(function (p) {
        tMin = Math.min(tMin, p[0]); tMax = Math.max(tMax, p[0]); yMax = Math.max(yMax, p[1]);
      });
    });
    const kids = [];
    if (yMax <= 0) yMax = 1;
    yMax *= 1.1;
    if (!isFinite(tMin) || tMax === tMin) { tMin = (isFinite(tMin) ? tMin : Date.now()) - 60000; tMax = tMin + 60000; }
    for (let i = 0; i <= 3; i++) {
      const y = T + (H - T - B) * i / 3;
      const line = document.createElementNS(SVG, "line");
      line.setAttribute("class", "grid");
      line.setAttribute("x1", L); line.setAttribute("x2", W); line.setAttribute("y1", y); line.setAttribute("y2", y);
      kids.push(line);
      const label = document.createElementNS(SVG, "text");
      label.setAttribute("class", "axis"); label.setAttribute("x", 2); label.setAttribute("y", y + 4);
      label.textContent = fmt(yMax * (3 - i) / 3, yMax < 10 ? 1 : 0);
      kids.push(label);
    }
    const span = document.createElementNS(SVG, "text");
    span.setAttribute("class", "axis"); span.setAttribute("x", L); span.setAttribute("y", H - 2);
    span.textContent = "last " + Math.round((tMax - tMin) / 1000) + " s" + (unit ? " · " + unit : "");
    kids.push(span);
    series.forEach(function (s, i) {
      if (!s.points.length) return;
      const pl = document.createElementNS(SVG, "polyline");
      pl.setAttribute("class", "s" + (i % 6));
      pl.setAttribute("points", s.points.map(function (p) {
        const x = L + (W - L) * (p[0] - tMin) / (tMax - tMin);
        const y = T + (H - T - B) * (1 - p[1] / yMax);
        return x.toFixed(1) + "," + y.toFixed(1);
      }).join(" "));
      const title = document.createElementNS(SVG, "title");
      title.textContent = s.name;
      pl.appendChild(title);
      kids.push(pl);
    });
    svg.replaceChildren.apply(svg, kids);
  }

  function series(history, key) {
    return history.filter(function (h) { return h[key] !== null && h[key] !== undefined; })
      .map(function (h) { return [h.t, h[key]]; });
  }

  function render(o) {
    const s = o.summary;
    setText("sum-bookies", String(s.bookies));
    setText("sum-writable", String(s.writable));
    setText("sum-read_only", String(s.read_only));
    setText("sum-down", String(s.down));
    setText("sum-adds_total", fmt(s.adds_total));
    setText("sum-adds_per_s", fmt(s.adds_per_s));
    setText("sum-under_replicated", String(s.under_replicated));
    const err = document.getElementById("error");
    if (err) { err.textContent = o.error || ""; err.className = o.error ? "error" : ""; }
    renderBookies(o.bookies);
    renderRecovery(o.recovery);
    const h = o.history || [];
    drawChart(document.getElementById("chart-adds"), [
      { name: "adds/s", points: series(h, "adds_per_s") },
      { name: "reads/s", points: series(h, "reads_per_s") },
    ], "requests/s");
    drawChart(document.getElementById("chart-latency"), [
      { name: "add p99 ms (worst bookie)", points: series(h, "add_p99_ms") },
      { name: "journal fsync p99 ms (worst bookie)", points: series(h, "journal_sync_p99_ms") },
    ], "ms");
    drawChart(document.getElementById("chart-recovery"), [
      { name: "under-replicated ledgers", points: series(h, "under_replicated") },
    ], "ledgers");
    setText("updated", "updated " + new Date(o.at_ms).toLocaleTimeString());
  }

  function tick() {
    fetch("/api/overview", { cache: "no-store" })
      .then(function (r) { return r.json(); })
      .then(render)
      .catch(function (e) { setText("error", "dashboard server unreachable: " + e); })
      .finally(function () { setTimeout(tick, REFRESH_MS); });
  }
  tick();
})();
