// vectorlb status page: polls the control API of the daemon that served it (same origin, same
// authentication) once a second and redraws. Plain DOM, no framework, no other origin.
'use strict';

const POLL_MS = 1000;
const HISTORY = 120; // points per chart: two minutes at one poll a second
const WINDOW_S = 10; // the API's window, until it says otherwise

const history = new Map(); // chart key -> recent values
let lastOk = 0;
let seeded = false;

// Absolute URLs from the origin: a page opened with user:token@ before its host has credentials in
// its own URL, and fetch() refuses URLs that carry them.
async function get(path) {
  const r = await fetch(location.origin + path, { credentials: 'same-origin', cache: 'no-store' });
  let body = null;
  try { body = await r.json(); } catch (_) { /* not JSON */ }
  // /v1/health answers 503 with its body when the data plane is degraded.
  if (!r.ok && !(path === '/v1/health' && r.status === 503 && body)) {
    const msg = body && body.error ? body.error : r.statusText;
    throw new Error(`${path}: ${r.status} ${msg}`);
  }
  return body;
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v;
    else if (k.startsWith('data-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function num(n, digits) {
  if (!isFinite(n)) return '-';
  const a = Math.abs(n);
  if (a >= 1e9) return (n / 1e9).toFixed(2) + 'G';
  if (a >= 1e6) return (n / 1e6).toFixed(2) + 'M';
  if (a >= 1e4) return (n / 1e3).toFixed(1) + 'k';
  return n.toFixed(digits === undefined ? (Number.isInteger(n) || a >= 100 ? 0 : 1) : digits);
}

function bytes(n) {
  const u = ['B', 'kB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (Math.abs(n) >= 1000 && i < u.length - 1) { n /= 1000; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + ' ' + u[i];
}

function duration(s) {
  s = Math.floor(s);
  if (s < 60) return s + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm ' + (s % 60) + 's';
  if (s < 86400) return Math.floor(s / 3600) + 'h ' + Math.floor((s % 3600) / 60) + 'm';
  return Math.floor(s / 86400) + 'd ' + Math.floor((s % 86400) / 3600) + 'h';
}

function remember(key, v) {
  const h = history.get(key) || [];
  h.push(v);
  if (h.length > HISTORY) h.shift();
  history.set(key, h);
  return h;
}

function spark(values) {
  const ns = 'http://www.w3.org/2000/svg';
  const svg = document.createElementNS(ns, 'svg');
  svg.setAttribute('class', 'spark');
  svg.setAttribute('viewBox', `0 0 ${HISTORY} 20`);
  svg.setAttribute('preserveAspectRatio', 'none');
  const max = Math.max(1e-9, ...values);
  const off = HISTORY - values.length;
  const pts = values.map((v, i) => `${off + i},${(19 - (v / max) * 18).toFixed(1)}`).join(' ');
  const line = document.createElementNS(ns, 'polyline');
  line.setAttribute('points', pts);
  svg.append(line);
  return svg;
}

function cell(text, cls, value) {
  const td = el('td', cls ? { class: cls } : {}, text);
  if (value !== undefined) td.setAttribute('data-value', String(value));
  return td;
}

function backendState(b) {
  if (b.health) return b.health.state; // up | down
  if (!b.resolved) return 'unresolved';
  return b.weight === 0 ? 'drain' : 'none';
}

function host(a, p) {
  return (a.includes(':') ? `[${a}]` : a) + ':' + p;
}

function renderServices(services) {
  const body = document.querySelector('#services tbody');
  const rows = [];
  for (const s of services) {
    const sk = `${s.proto}/${host(s.vip, s.port)}`;
    const r = s.stats.rates;
    // Serving: up by its check, or without a check, resolved and not drained.
    const up = s.backends.filter(b => ['up', 'none'].includes(backendState(b))).length;
    const sched = s.scheduler + (s.table_size ? ` (${s.table_size})` : '');
    rows.push(el('tr', { class: 'service', 'data-service': sk },
      cell(`${s.proto.toUpperCase()} ${host(s.vip, s.port)}`),
      cell(`${s.mode} · ${sched}`),
      cell(`${up}/${s.backends.length} up`),
      cell(''),
      cell(num(s.backends.reduce((a, b) => a + b.active_sessions, 0)), 'n'),
      cell(num(r.new_sessions_per_second), 'n new-rate', r.new_sessions_per_second),
      cell(num(r.packets_per_second), 'n pkt-rate', r.packets_per_second),
      cell(bytes(r.bytes_per_second) + '/s', 'n byte-rate', r.bytes_per_second),
      el('td', {}, spark(remember(sk, r.new_sessions_per_second)))));
    for (const b of s.backends) {
      const bk = host(b.addr, b.port);
      const st = backendState(b);
      const br = b.rates;
      const stateCell = el('td', {}, el('span', { class: `state ${st}` }, st));
      if (b.health && b.health.last_error) stateCell.title = b.health.last_error;
      rows.push(el('tr', { class: 'backend', 'data-service': sk, 'data-backend': bk, 'data-state': st },
        cell(bk),
        cell(b.health ? `for ${duration(b.health.since_seconds)} · ${num(b.health.failed_checks)}/${num(b.health.checks)} checks failed` : 'no health check', 'muted'),
        stateCell,
        cell(b.weight, 'weight'),
        cell(num(b.active_sessions), 'n active', b.active_sessions),
        cell(num(br.new_sessions_per_second), 'n new-rate', br.new_sessions_per_second),
        cell(num(br.packets_per_second), 'n pkt-rate', br.packets_per_second),
        cell(bytes(br.bytes_per_second) + '/s', 'n byte-rate', br.bytes_per_second),
        el('td', {}, spark(remember(sk + ' ' + bk, br.new_sessions_per_second)))));
    }
  }
  if (!rows.length) rows.push(el('tr', {}, el('td', { colSpan: 9, class: 'muted' }, 'no services configured')));
  body.replaceChildren(...rows);
}

function renderSummary(st) {
  const r = st.rates;
  const cards = [
    ['Received', num(r.rx_packets_per_second) + ' pkt/s', 'rx'],
    ['Sent', num(r.tx_packets_per_second) + ' pkt/s', 'tx'],
    ['Dropped', num(r.drops_per_second) + ' pkt/s', 'drops'],
    ['New sessions', num(r.new_sessions_per_second) + '/s', 'new'],
    ['Live sessions', num(st.sessions), 'sessions'],
    ['Mbufs free', num(st.mbufs_available), 'mbufs'],
    ['Workers', st.workers, 'workers'],
    ['Config generation', st.generation + (st.reload_failures ? ` (${st.reload_failures} failed reloads)` : ''), 'generation'],
    ['Up', duration(st.uptime_seconds), 'uptime'],
  ];
  document.querySelector('#summary').replaceChildren(...cards.map(([k, v, id]) =>
    el('div', { class: 'card', 'data-card': id }, el('div', { class: 'v' }, v), el('div', { class: 'k' }, k))));
  document.querySelector('#window').textContent = Math.max(1, Math.round(r.window_seconds || WINDOW_S));
  // The pipeline's reasons and the worker loops' (tx_full, handoff_full, ...), as /metrics has them.
  const drops = Object.keys(r.drops_by_reason).map(reason => [reason, st.drops[reason] ?? st.io[reason] ?? 0, r.drops_by_reason[reason]])
    .filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1]);
  const rows = drops.map(([reason, n, rate]) => el('tr', { 'data-reason': reason }, cell(reason), cell(num(n), 'n', n), cell(num(rate), 'n', rate)));
  if (!rows.length) rows.push(el('tr', {}, el('td', { colSpan: 3, class: 'muted' }, 'no drops')));
  document.querySelector('#drops tbody').replaceChildren(...rows);
  const ha = st.ha, sy = st.sync;
  const haPill = document.querySelector('#ha');
  haPill.textContent = 'HA ' + ha.state;
  const kv = [
    ['State', `${ha.state} for ${duration(ha.since_seconds)}`],
    ['Transitions', ha.transitions],
    ['Session sync', sy.configured ? 'on' : 'not configured'],
  ];
  if (sy.configured) {
    kv.push(['Unacknowledged datagrams (lag)', sy.unacked_datagrams],
      ['Batch period', num(sy.batch_period_ms, 1) + ' ms'],
      ['Records sent / received', `${num(sy.records_sent)} / ${num(sy.records_received)}`],
      ['Installed / rejected', `${num(sy.installed)} / ${num(sy.rejected.unknown + sy.rejected.stale + sy.rejected.port_taken + sy.rejected.table_full)}`],
      ['Refused messages', num(sy.refused.bad_hmac + sy.refused.truncated + sy.refused.malformed + sy.refused.replayed)],
      ['Last received', sy.last_received_seconds_ago == null ? 'never' : duration(sy.last_received_seconds_ago) + ' ago']);
  }
  const bgp = st.bgp;
  kv.push(['BGP', bgp ? bgp.state + (bgp.bird_running ? '' : ' (BIRD down)') : 'not configured']);
  if (bgp) {
    kv.push(['Announced', bgp.announced.join(', ') || 'nothing']);
    if ((bgp.announced_backup || []).length) kv.push(['Backup routes', bgp.announced_backup.join(', ')]);
    if (bgp.withheld.length) kv.push(['Withheld', bgp.withheld.join(', ')]);
    for (const r of bgp.reasons) kv.push(['Why', r]);
    if (bgp.drain) kv.push(['Drain', `${num(bgp.drain.sessions)} sessions left, deadline in ${duration(bgp.drain.deadline_in_seconds)}`]);
    for (const n of bgp.neighbors) kv.push([`Neighbour ${n.address} (AS ${n.asn})`, `${n.established ? 'established' : n.state} ${n.info}`.trim()]);
  }
  document.querySelector('#hasync tbody').replaceChildren(...kv.map(([k, v]) => el('tr', {}, el('th', {}, k), cell(v))));
}

function renderPorts(ports) {
  const rows = ports.map(p => {
    const rx = p.rates.rx_packets_per_second;
    const tx = p.rates.tx_packets_per_second;
    let link = p.link_up ? 'up' : 'down';
    if (p.memif) link = `memif ${p.memif.role} ${p.memif.connected ? 'connected' : 'waiting'}`;
    else if (p.link_up && p.speed_mbps) link += ` ${p.speed_mbps >= 1000 ? p.speed_mbps / 1000 + 'G' : p.speed_mbps + 'M'}`;
    const errs = (p.ierrors || 0) + (p.oerrors || 0) + (p.rx_nombuf || 0);
    return el('tr', { 'data-port': p.name },
      el('td', { title: p.device }, p.name + (p.xdp_interface ? ` (${p.xdp_interface})` : '')),
      el('td', {}, el('span', { class: `state ${p.memif && !p.memif.connected ? 'none' : p.link_up ? 'up' : 'down'}` }, link)),
      cell(num(rx), 'n', rx), cell(num(tx), 'n', tx),
      cell(bytes(p.rates.rx_bytes_per_second) + '/s', 'n'), cell(bytes(p.rates.tx_bytes_per_second) + '/s', 'n'),
      cell(num(p.imissed || 0), 'n'), cell(num(errs), 'n'));
  });
  document.querySelector('#ports tbody').replaceChildren(...rows);
}

// Queue sets (and the default set), when the daemon has any or polices the default set.
function renderQueueSets(sets) {
  document.querySelector('#qs-section').hidden = !sets.length;
  const us = v => (v == null ? '> 10 ms' : v >= 1000 ? num(v / 1000, 1) + ' ms' : v + ' µs');
  const rows = sets.map(q => el('tr', { 'data-set': q.name },
    cell(q.name + (q.busy_poll ? ' (busy-polling)' : '')),
    cell(q.workers.join(', ')),
    cell(q.services.length ? q.services.join(' ') : (q.name === 'default' ? 'the rest' : '-'), 'muted'),
    cell(num(q.packets.rx), 'n rx', q.packets.rx),
    cell(num(q.packets.tx), 'n tx', q.packets.tx),
    cell(num(q.packets.steered), 'n steered', q.packets.steered),
    cell(num(q.packets.dropped), 'n dropped', q.packets.dropped),
    cell(q.queues.packets ? us(q.queues.wait_us.p99) : '-', 'n wait'),
    cell(q.queues.packets ? us(q.queues.residence_us.p99) : '-', 'n residence'),
    cell(q.xdp ? num(q.xdp.packets) : '-', 'n xdp-passed', q.xdp ? q.xdp.packets : ''),
    cell(q.xdp ? num(q.xdp.policed) : '-', 'n xdp-policed', q.xdp ? q.xdp.policed : '')));
  document.querySelector('#queuesets tbody').replaceChildren(...rows);
}

function renderHealth(h) {
  const pill = document.querySelector('#health');
  pill.textContent = h.status === 'ok' ? 'data plane ok' : 'data plane ' + h.status;
  pill.className = 'pill ' + (h.status === 'ok' ? 'ok' : 'bad');
  const ul = document.querySelector('#problems');
  ul.replaceChildren(...(h.problems || []).map(p => el('li', {}, p)));
  ul.hidden = !(h.problems && h.problems.length);
}

// The charts start with the daemon's last two minutes, then grow with every poll.
async function seed() {
  const h = await get('/v1/history');
  for (const s of h.services) {
    const sk = `${s.proto}/${host(s.vip, s.port)}`;
    history.set(sk, s.series.new_sessions_per_second.slice(-HISTORY));
    for (const b of s.backends) history.set(sk + ' ' + host(b.addr, b.port), b.series.new_sessions_per_second.slice(-HISTORY));
  }
  seeded = true;
}

async function poll() {
  const error = document.querySelector('#error');
  try {
    if (!seeded) await seed();
    const [health, stats, services, ports] = await Promise.all([get('/v1/health'), get('/v1/stats'), get('/v1/services'), get('/v1/ports')]);
    renderHealth(health);
    renderSummary(stats);
    renderServices(services);
    renderPorts(ports);
    renderQueueSets(stats.queue_sets || []);
    lastOk = Date.now();
    error.hidden = true;
    document.body.setAttribute('data-updated', String(lastOk));
    document.querySelector('#updated').textContent = 'updated ' + new Date(lastOk).toLocaleTimeString();
  } catch (e) {
    error.hidden = false;
    const age = lastOk ? ` (figures below are from ${Math.round((Date.now() - lastOk) / 1000)} s ago)` : '';
    error.textContent = `cannot read the API: ${e.message}${age}`;
  }
  setTimeout(poll, POLL_MS);
}

poll();
