// Small shared pieces: states, bars, confirmation, the usage chart.
import { useEffect, useRef, useState } from 'preact/hooks';
import type { ComponentChildren } from 'preact';
import { Chart, LineController, LineElement, PointElement, LinearScale, Legend, Tooltip, Filler } from 'chart.js';
import type { Page, Session } from './api';
import { compact, dayOfPeriod, formatAmount, formatBare, formatMicros, formatUsedOf, level, onDayAxis, percent, ratio, urlPieces } from './format';

Chart.register(LineController, LineElement, PointElement, LinearScale, Legend, Tooltip, Filler);

/** PageProps are what every page of the console gets. */
export type PageProps = { session: Session };

export function Loading({ what }: { what: string }) {
  return <p class="state loading" role="status" aria-live="polite">Loading {what}…</p>;
}

export function ErrorState({ error, retry }: { error: unknown; retry?: () => void }) {
  const msg = error instanceof Error ? error.message : String(error);
  return (
    <div class="state error" role="alert">
      <p>{msg}</p>
      {retry && <button type="button" onClick={retry}>Try again</button>}
    </div>
  );
}

/**
 * URLText writes a URL that wraps only between its pieces (urlPieces: after "/", ".",
 * "?", "&", "=", "#", "-"), never inside a word of it.
 */
export function URLText({ url }: { url: string }) {
  return <span class="url">{urlPieces(url).map((p, i) => <>{i > 0 && <wbr />}{p}</>)}</span>;
}

/**
 * Id writes an id (up to 128 characters, nowhere to break) on one line, with what comes
 * before it (a user's "team/"): cut short with an ellipsis where it would not fit its
 * room, whole in its title and its text.
 */
export function Id({ id, before }: { id: string; before?: string }) {
  return <span class="id" title={`${before ?? ''}${id}`}>{before && <span class="muted">{before}</span>}{id}</span>;
}

/** LONG_WORD is the length past which IdText takes a word for an id and cuts it short. */
const LONG_WORD = 24;

/**
 * IdText writes text that may name ids (up to 128 characters) or emails (up to 254),
 * words nowhere to break: each word longer than LONG_WORD characters is an Id, cut short
 * with an ellipsis where it would not fit, whole in its title and the text; the rest
 * wraps between words as any text.
 */
export function IdText({ text }: { text: string }) {
  return <>{text.split(/(\s+)/).map((w) => (w.length > LONG_WORD && /\S/.test(w) ? <Id id={w} /> : w))}</>;
}

export function Empty({ children }: { children: ComponentChildren }) {
  return <p class="state empty">{children}</p>;
}

/** useLoad runs load when deps change and tracks its state. */
export function useLoad<T>(load: () => Promise<T>, deps: unknown[]): { data?: T; error?: unknown; loading: boolean; reload: () => void } {
  const [state, setState] = useState<{ data?: T; error?: unknown; loading: boolean }>({ loading: true });
  const [n, setN] = useState(0);
  useEffect(() => {
    let live = true;
    setState((s) => ({ ...s, loading: true }));
    load().then((data) => live && setState({ data, loading: false }), (error) => live && setState({ error, loading: false }));
    return () => { live = false; };
  }, [...deps, n]);
  return { ...state, reload: () => setN((x) => x + 1) };
}

/**
 * usePaged loads a cursor-paged list: the first page when deps change (or on reload),
 * then one more page per call of more, appended. A page answered after a reload began
 * is dropped, so a slow "more" never mixes an old list into a new one.
 */
export function usePaged<T>(fetchPage: (cursor?: string) => Promise<Page<T>>, deps: unknown[]): {
  items: T[]; loaded: boolean; loading: boolean; error?: unknown; reload: () => void;
  hasMore: boolean; more: () => Promise<void>; loadingMore: boolean; moreError?: unknown;
} {
  const [items, setItems] = useState<T[]>([]);
  const [cursor, setCursor] = useState<string | null>(null);
  const [loadingMore, setLoadingMore] = useState(false);
  const [moreError, setMoreError] = useState<unknown>();
  const gen = useRef(0);
  const first = useLoad(async () => {
    const g = ++gen.current;
    const p = await fetchPage();
    if (g === gen.current) { setItems(p.items); setCursor(p.next_cursor); setMoreError(undefined); }
    return p;
  }, deps);
  const more = async () => {
    if (!cursor || loadingMore) return;
    const g = gen.current;
    setLoadingMore(true);
    try {
      const p = await fetchPage(cursor);
      if (g === gen.current) { setItems((xs) => [...xs, ...p.items]); setCursor(p.next_cursor); setMoreError(undefined); }
    } catch (e) {
      if (g === gen.current) setMoreError(e);
    } finally {
      setLoadingMore(false);
    }
  };
  return { items, loaded: first.data !== undefined, loading: first.loading, error: first.error, reload: first.reload, hasMore: cursor !== null, more, loadingMore, moreError };
}

export function UsageBar({ label, used, limit, unthrottled, currency }: { label: string; used: number; limit: number; unthrottled?: number; currency?: string }) {
  const lv = level(used, limit);
  return (
    <div class="usage-bar" data-level={lv}>
      <div class="usage-bar-label">
        <span>{label}</span>
        <span><strong>{formatAmount(used, currency)}</strong> of {formatBare(limit, currency)} ({percent(used, limit)})
          {unthrottled !== undefined && unthrottled !== limit && <span class="muted" data-testid="throttled-from"> throttled from {formatBare(unthrottled, currency)}</span>}</span>
      </div>
      <div class="bar" role="progressbar" aria-label={label} aria-valuemin={0} aria-valuemax={limit} aria-valuenow={Math.min(used, limit)}
        aria-valuetext={formatUsedOf(used, limit, currency)}>
        <div class="bar-fill" style={{ width: `${Math.min(100, ratio(used, limit) * 100)}%` }} />
      </div>
    </div>
  );
}

/**
 * MiniBar is a usage bar for a table cell: the bar, then "used of limit (percent)". With
 * units held by open reservations, a second, lighter segment follows the used one and the
 * text says "used + reserved of limit"; both count against the limit (share and colour).
 */
export function MiniBar({ used, limit, label, reserved = 0, currency }: { used: number; limit: number; label: string; reserved?: number; currency?: string }) {
  const all = used + reserved;
  const usedW = Math.min(100, ratio(used, limit) * 100);
  const heldW = Math.min(100 - usedW, ratio(reserved, limit) * 100);
  const amt = (n: number) => formatAmount(n, currency);
  const bare = (n: number) => formatBare(n, currency);
  const text = reserved > 0 ? `${amt(used)} used + ${amt(reserved)} reserved of ${bare(limit)}` : formatUsedOf(used, limit, currency);
  return (
    <div class="mini-bar" data-level={level(all, limit)}>
      <div class="bar" role="progressbar" aria-label={label} aria-valuemin={0} aria-valuemax={limit} aria-valuenow={Math.min(all, limit)}
        aria-valuetext={text}>
        <div class="bar-fill" style={{ width: `${usedW}%` }} />
        {reserved > 0 && <div class="bar-held" data-testid="bar-held" style={{ width: `${heldW}%` }} />}
      </div>
      <span class="mini-bar-text">{reserved > 0
        ? <><strong>{amt(used)}</strong> used + <strong class="held">{amt(reserved)}</strong> reserved of {bare(limit)}</>
        : <><strong>{amt(used)}</strong> of {bare(limit)}</>} <span class="pct">{percent(all, limit)}</span></span>
    </div>
  );
}

/** Confirm asks before an action in a modal dialog; Escape or Cancel closes it. */
export function Confirm({ title, body, confirmLabel, danger, onConfirm, onClose }: {
  title: string; body: ComponentChildren; confirmLabel: string; danger?: boolean; onConfirm: () => Promise<void> | void; onClose: () => void;
}) {
  const ref = useRef<HTMLDialogElement>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>();
  useEffect(() => {
    const d = ref.current;
    if (d && !d.open) d.showModal();
    return () => { if (d?.open) d.close(); };
  }, []);
  return (
    <dialog ref={ref} class="confirm" aria-labelledby="confirm-title" onCancel={(e) => { e.preventDefault(); onClose(); }}>
      <h2 id="confirm-title"><IdText text={title} /></h2>
      <div>{body}</div>
      {error !== undefined && <ErrorState error={error} />}
      <div class="actions">
        <button type="button" onClick={onClose}>Cancel</button>
        <button type="button" class={danger ? 'danger' : 'primary'} disabled={busy} onClick={async () => {
          setBusy(true);
          try { await onConfirm(); onClose(); } catch (e) { setError(e); setBusy(false); }
        }}>{confirmLabel}</button>
      </div>
    </dialog>
  );
}

/**
 * PaceChart draws a period's recorded cumulative usage (dailySeries), its dashed
 * projection at the pace so far, and the month limit when there is one.
 */
export function PaceChart({ metric, actual, projected, limit, days, currency }: {
  metric: string; actual: [number, number][]; projected: [number, number][]; limit?: number; days: number; currency?: string;
}) {
  const ref = useRef<HTMLCanvasElement>(null);
  useEffect(() => {
    if (!ref.current) return;
    const pts = (p: [number, number][]) => onDayAxis(p).map(([x, y]) => ({ x, y })); // day 1 is the period's first
    const datasets = [
      { label: `${metric} used (end of each day)`, data: pts(actual), borderColor: '#2563eb', backgroundColor: 'rgba(37,99,235,.12)', fill: true, tension: 0 },
      { label: 'projection at this pace', data: pts(projected), borderColor: '#64748b', borderDash: [6, 4], pointRadius: 0, fill: false },
    ];
    // The limit line on every chart with a month limit: far below it, the usage hugs the
    // axis, and that is what the chart has to say.
    if (limit !== undefined) datasets.push({ label: 'month limit', data: pts([[0, limit], [days, limit]]), borderColor: '#dc2626', borderDash: [2, 3], pointRadius: 0, fill: false } as never);
    const chart = new Chart(ref.current, {
      type: 'line',
      data: { datasets },
      options: {
        animation: false, responsive: true, maintainAspectRatio: false, parsing: false,
        scales: {
          x: { type: 'linear', min: 1, max: days + 1, title: { display: true, text: 'day of the period' } },
          // Money (spend, in micro-units) is labelled as an amount of its currency.
          y: { beginAtZero: true, ticks: { callback: (v) => (currency ? formatMicros(Math.round(Number(v))) : compact(Number(v))) } },
        },
        plugins: { legend: { position: 'bottom' } },
      },
    });
    return () => chart.destroy();
  }, [metric, JSON.stringify(actual), JSON.stringify(projected), limit, days, currency]);
  return (
    <div class="chart" role="img" aria-label={`${metric}: ${formatAmount(actual[actual.length - 1]?.[1] ?? 0, currency)} used so far this period (day ${dayOfPeriod(actual[actual.length - 1]?.[0] ?? 0, days)} of ${days})${limit !== undefined ? `; the month limit of ${formatBare(limit, currency)} drawn as a red line` : ''}`}>
      <canvas ref={ref} />
    </div>
  );
}
