// Live updates for the connector's status page. The page is complete
// without this script; it only polls /status (the same data the page was
// rendered from) every second and refreshes counters, conditions, drops,
// message rates (computed by the server), the reload banner and the
// process facts. Every piece of data is written with textContent or as an
// SVG number list, never parsed as HTML: resource names, topics and error
// texts come from configuration and brokers and are not trusted.
"use strict";

(() => {
  const PERIOD_MS = 1000;
  const HISTORY = 60; // samples kept for a sparkline: one minute
  const SPARK_W = 120;
  const SPARK_H = 32;
  const KINDS = ["received", "bridged", "dropped"];

  const cards = new Map();
  for (const el of document.querySelectorAll("section.res")) {
    cards.set(el.dataset.resource, { el, hist: { received: [], bridged: [], dropped: [] } });
  }
  const liveEl = document.getElementById("live");
  const overallEl = document.getElementById("overall");
  const updatedEl = document.getElementById("updated");
  const noticeEl = document.getElementById("notice");
  const countEl = document.getElementById("count");
  const reloadEl = document.getElementById("reload-banner");
  const versionEl = document.getElementById("version");
  const instanceEl = document.getElementById("instance");
  const uptimeEl = document.getElementById("uptime");
  const processEl = document.getElementById("process-ready");
  const intFmt = new Intl.NumberFormat("en-US");

  // field finds an element by its data-f name; names are this script's own
  // constants, never data.
  const field = (root, name) => root.querySelector('[data-f="' + name + '"]');
  const spark = (root, name) => root.querySelector('[data-spark="' + name + '"]');

  function setText(el, text) {
    if (el && el.textContent !== text) el.textContent = text;
  }

  function setPill(el, ok, okText, badText) {
    if (!el) return;
    el.classList.toggle("ok", ok);
    el.classList.toggle("bad", !ok);
    setText(el, ok ? okText : badText);
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function fmtRate(r) {
    if (r === null) return "—";
    if (r === 0) return "0";
    if (r < 10) return r.toFixed(1);
    return intFmt.format(Math.round(r));
  }

  function ago(iso) {
    const t = Date.parse(iso);
    if (Number.isNaN(t) || t <= 0) return "";
    return duration((Date.now() - t) / 1000);
  }

  // duration renders seconds the way the server's humanDuration does.
  function duration(secs) {
    const s = Math.max(0, Math.floor(secs));
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m";
    if (s < 48 * 3600) return Math.floor(s / 3600) + "h" + Math.floor((s % 3600) / 60) + "m";
    return Math.floor(s / 86400) + "d";
  }

  function clock(iso) {
    const t = Date.parse(iso || "");
    if (Number.isNaN(t) || t <= 0) return "—";
    return new Date(t).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }

  function condClass(status) {
    if (status === "True") return "ok";
    if (status === "False") return "bad";
    return "unknown";
  }

  function sumDropped(c) {
    let n = 0;
    for (const v of Object.values(c.dropped || {})) n += v;
    return n;
  }

  function drawSpark(root, kind, values) {
    const line = spark(root, kind);
    const area = spark(root, kind + ".area");
    if (!line || !area) return;
    const max = Math.max(1, ...values);
    const step = SPARK_W / (HISTORY - 1);
    const x0 = SPARK_W - step * (values.length - 1);
    const pts = values.map((v, i) => {
      const x = (x0 + i * step).toFixed(1);
      const y = (SPARK_H - 1 - (v / max) * (SPARK_H - 3)).toFixed(1);
      return x + "," + y;
    });
    if (pts.length === 1) pts.unshift((SPARK_W - step).toFixed(1) + "," + pts[0].split(",")[1]);
    line.setAttribute("points", pts.join(" "));
    const first = pts[0].split(",")[0];
    area.setAttribute("points", first + "," + SPARK_H + " " + pts.join(" ") + " " + SPARK_W + "," + SPARK_H);
  }

  function renderConditions(root, conds) {
    const body = field(root, "conditions");
    if (!body) return;
    const rows = [];
    for (const c of conds || []) {
      const tr = el("tr");
      tr.append(el("td", "", c.type));
      const st = el("td");
      st.append(el("span", "dot " + condClass(c.status)), document.createTextNode(c.status));
      tr.append(st);
      const reason = el("td", "", c.reason);
      if (c.message) reason.append(el("div", "msg", c.message));
      tr.append(reason);
      const since = el("td");
      const t = el("time", "", ago(c.lastTransitionTime));
      t.dateTime = c.lastTransitionTime;
      t.title = clock(c.lastTransitionTime);
      since.append(t);
      tr.append(since);
      rows.push(tr);
    }
    body.replaceChildren(...rows);
  }

  function renderDrops(root, dropped) {
    const body = field(root, "drops");
    if (!body) return;
    const reasons = Object.keys(dropped || {}).sort();
    if (reasons.length === 0) {
      const tr = el("tr", "none");
      const td = el("td", "", "No drops.");
      td.colSpan = 2;
      tr.append(td);
      body.replaceChildren(tr);
      return;
    }
    body.replaceChildren(...reasons.map((r) => {
      const tr = el("tr");
      const td = el("td");
      td.append(el("code", "", r));
      tr.append(td, el("td", "num", String(dropped[r])));
      return tr;
    }));
  }

  // failing mirrors pageResource.Failing: the supervisor's failure, else
  // the first side whose condition is False.
  function failing(r) {
    if (r.failure) return { reason: r.failure.reason, message: r.failure.message, side: "", failure: r.failure };
    for (const t of ["WeidaReady", "BrokerConnected"]) {
      const c = (r.conditions || []).find((x) => x.type === t);
      if (c && c.status === "False") return { reason: c.reason, message: c.message, side: t, failure: null };
    }
    return null;
  }

  function renderFailure(root, r) {
    const box = field(root, "failure");
    if (!box) return;
    const f = failing(r);
    box.hidden = !f;
    if (!f) return;
    setText(field(box, "failure.reason"), String(f.reason || ""));
    setText(field(box, "failure.side"), String(f.side || ""));
    setText(field(box, "failure.message"), String(f.message || ""));
    const meta = field(box, "failure.meta");
    if (meta) meta.hidden = !f.failure;
    if (!f.failure) return;
    setText(field(box, "failure.attempts"), String(f.failure.attempts ?? ""));
    setText(field(box, "failure.lastErrorTime"), clock(f.failure.lastErrorTime));
    setText(field(box, "failure.nextRetryTime"), clock(f.failure.nextRetryTime));
  }

  function renderCopyable(root, name, value) {
    const row = field(root, name + ".row");
    if (row) row.hidden = !value;
    setText(field(root, name), String(value || ""));
  }

  // renderPlacement refreshes who runs the resource. The row exists only
  // when the page was rendered with a placement: replicas share resources
  // through leases for the life of the process or not at all.
  function renderPlacement(root, p) {
    const row = field(root, "placement.row");
    if (!row || !p) return;
    const role = field(row, "placement.role");
    if (role && role.textContent !== String(p.role || "")) {
      role.className = "role " + String(p.role || "");
      setText(role, String(p.role || ""));
    }
    setText(field(row, "placement.holder"), String(p.holder || "none"));
    setText(field(row, "placement.epoch"), p.epoch ? String(p.epoch) : "—");
    const list = field(row, "placement.standbys");
    const standbys = p.standbys || [];
    if (!list || list.dataset.v === standbys.join("\n")) return;
    list.dataset.v = standbys.join("\n");
    list.replaceChildren();
    if (standbys.length === 0) list.textContent = "none";
    standbys.forEach((s, i) => {
      if (i) list.append(", ");
      list.append(el("code", "", String(s)));
    });
  }

  // Routes are matched by position: the page and /status list them in the
  // resource's order, and a name from configuration never becomes a selector.
  function renderRoutes(root, routes) {
    const items = root.querySelectorAll(".routes li[data-route]");
    (routes || []).forEach((rt, i) => {
      const li = items[i];
      if (!li) return;
      setText(field(li, "route.bridged"), String(rt.bridged ?? 0));
      setText(field(li, "route.dropped"), String(rt.dropped ?? 0));
    });
  }

  function renderReload(r) {
    if (!reloadEl) return;
    const refused = !!r && r.result === "refused";
    reloadEl.hidden = !refused;
    if (!refused) return;
    setText(field(reloadEl, "reload.time"), clock(r.time));
    setText(field(reloadEl, "reload.trigger"), String(r.trigger || ""));
    setText(field(reloadEl, "reload.lastSuccessTime"), clock(r.lastSuccessTime));
    setText(field(reloadEl, "reload.errors"), (r.errors || []).join("\n"));
  }

  function renderProcess(p, notReady) {
    if (!p) return;
    setText(versionEl, p.version || "—");
    setText(instanceEl, p.instance || "—");
    setText(uptimeEl, duration(p.uptimeSeconds || 0));
    let text = p.ready ? "ready" : "not ready";
    if (notReady && notReady.length) text += " · not ready: " + notReady.join(", ");
    setText(processEl, text);
  }

  // Copy buttons copy the text of their row's code element.
  async function copy(btn) {
    const code = btn.parentElement && btn.parentElement.querySelector("code");
    const text = code ? code.textContent : "";
    try {
      await navigator.clipboard.writeText(text);
    } catch (e) {
      // No clipboard API (not a secure context): select the text so
      // that the user can copy it with the keyboard.
      const sel = window.getSelection();
      const range = document.createRange();
      range.selectNodeContents(code);
      sel.removeAllRanges();
      sel.addRange(range);
      btn.title = "Selected: press Ctrl+C (the browser refused the clipboard)";
    }
    btn.classList.add("done");
    setText(btn, "Copied");
    setTimeout(() => {
      btn.classList.remove("done");
      setText(btn, "Copy");
    }, 1500);
  }
  document.addEventListener("click", (ev) => {
    const btn = ev.target instanceof Element ? ev.target.closest("button.copy") : null;
    if (btn) copy(btn);
  });

  function render(data, now) {
    const resources = data.resources || [];
    setPill(overallEl, !!data.ready, "Ready", "Not ready");
    document.title = (data.ready ? "Ready" : "Not ready") + " · weida-connector";
    setText(countEl, String(resources.length));
    setText(updatedEl, clock(new Date(now).toISOString()));
    renderProcess(data.process, data.notReady);
    renderReload(data.lastReload);

    const seen = new Set();
    for (const r of resources) {
      seen.add(r.name);
      const card = cards.get(r.name);
      if (!card) continue;
      const root = card.el;
      const c = r.counters || {};
      const ready = (r.conditions || []).some((x) => x.type === "Ready" && x.status === "True");
      setPill(field(root, "ready"), ready, "Ready", "Not ready");
      root.classList.toggle("down", !ready);
      const dropped = sumDropped(c);
      setText(field(root, "received"), String(c.received ?? 0));
      setText(field(root, "bridged"), String(c.bridged ?? 0));
      setText(field(root, "dropped"), String(dropped));
      setText(field(root, "acknowledged"), String(c.acknowledged ?? 0));
      setText(field(root, "inFlight"), String(c.inFlight ?? 0));
      setText(field(root, "reconnects"), String(c.reconnects ?? 0));
      setText(field(root, "subscribers"), String(c.weidaSubscribers ?? 0));
      renderConditions(root, r.conditions);
      renderDrops(root, c.dropped);
      renderFailure(root, r);
      renderCopyable(root, "fingerprint", r.fingerprint);
      renderCopyable(root, "subscriberURL", r.subscriberURL);
      renderPlacement(root, r.placement);
      renderRoutes(root, r.routes);

      // The rates are the server's (see "rates" in /status), so that the
      // page and a script reading /status agree.
      const rates = r.rates || null;
      for (const k of KINDS) {
        const rate = rates ? rates[k] ?? 0 : null;
        setText(field(root, "rate." + k), fmtRate(rate));
        if (rate === null) continue;
        const h = card.hist[k];
        h.push(rate);
        if (h.length > HISTORY) h.shift();
        drawSpark(root, k, h);
      }
    }

    let changed = seen.size !== cards.size;
    for (const name of cards.keys()) if (!seen.has(name)) changed = true;
    if (changed && noticeEl.hidden) {
      const a = el("a", "", "Reload");
      a.href = "/";
      noticeEl.replaceChildren(document.createTextNode("The set of resources changed since this page was loaded. "), a);
      noticeEl.hidden = false;
    }
  }

  function setLive(ok, why) {
    liveEl.classList.toggle("off", !ok);
    setText(liveEl, ok ? "live" : "offline");
    liveEl.title = ok ? "Updated every second from /status" : "Cannot read /status: " + why;
  }

  async function poll() {
    try {
      const resp = await fetch("/status", { cache: "no-store", headers: { Accept: "application/json" } });
      if (!resp.ok) throw new Error("HTTP " + resp.status);
      const data = await resp.json();
      setLive(true);
      render(data, Date.now());
    } catch (e) {
      setLive(false, String(e && e.message ? e.message : e));
    } finally {
      setTimeout(poll, PERIOD_MS);
    }
  }

  poll();
})();
