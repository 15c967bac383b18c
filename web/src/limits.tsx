// The limits editor: a team's or user's limits with inline edits, and the 422 of an
// allocation rule shown next to the field it is about. A limit of a second to day
// window may carry a burst (a token bucket: it refills the limit per window and holds
// at most the burst); an empty burst is a sliding window. A metric that is money (spend,
// counted in micro-units of the plan's currency) is shown and typed as an amount of the
// currency ("200.00 USD") and sent as micro-units.
import { useState } from 'preact/hooks';
import { ApiError, WINDOWS, type Limit, type Window } from './api';
import { bucketable, formatMicrosExact, formatNumber, formatNumbersIn, limitField, parseBurst, parseLimitIn, setLimit, sortLimits } from './format';
import { IdText } from './ui';

type ListName = 'limits' | 'user_limits';
/** Money maps each metric that is money to its currency ({ spend: 'USD' }, see currencies). */
type Money = Record<string, string>;

/** limitText writes a limit as the table shows it: "5,000", or money "200.00 USD" (exact, not rounded to the cent). */
export function limitText(limit: number, currency?: string): string {
  return currency ? `${formatMicrosExact(limit)} ${currency}` : formatNumber(limit);
}

/** limitLabel writes a limit's cell: its limit, and a token bucket's burst ("10, burst 30"). */
export function limitLabel(l: Limit, currency?: string): string {
  return l.burst ? `${limitText(l.limit, currency)}, burst ${limitText(l.burst, currency)}` : limitText(l.limit, currency);
}

/**
 * errorFor picks the API's message about field, or its detail for anything else, with
 * its numbers written as the console writes them (formatNumbersIn).
 */
export function errorFor(e: unknown, field: string): string {
  if (e instanceof ApiError) return formatNumbersIn(e.fieldMessage(field) ?? e.message);
  return e instanceof Error ? e.message : String(e);
}

/**
 * saveErrors splits the API's refusal of a saved limit into the message about its burst
 * field (when it names it) and the one about its limit (or the whole refusal).
 */
function saveErrors(e: unknown, list: ListName, next: Limit[], metric: string, window: Window): { limit?: string; burst?: string } {
  const burst = e instanceof ApiError ? e.fieldMessage(limitField(list, next, metric, window, 'burst')) : undefined;
  if (burst !== undefined) return { burst: formatNumbersIn(burst) };
  return { limit: errorFor(e, limitField(list, next, metric, window)) };
}

/** BurstInput is the burst field of a limit: empty for a sliding window. */
function BurstInput({ id, value, error, currency, onInput }: { id: string; value: string; error?: string; currency?: string; onInput: (v: string) => void }) {
  return (
    <>
      <label for={id}>Burst{currency && <span class="sr-only"> in {currency}</span>}</label>
      <input id={id} name="burst" inputMode={currency ? 'decimal' : 'numeric'} value={value} placeholder="empty: sliding window"
        title="A token bucket: refills the limit each window and holds at most the burst. Empty: a sliding window."
        aria-invalid={error ? 'true' : undefined} aria-describedby={error ? `${id}-error` : undefined}
        onInput={(e) => onInput((e.target as HTMLInputElement).value)} />
      {error && <p id={`${id}-error`} class="field-error" role="alert">{error}</p>}
    </>
  );
}

/**
 * LimitsEditor lists a level's limits with inline edits. defaults are what applies
 * where the level has no limit of its own (a registered user gets the team's user
 * defaults per metric and window): they are shown, marked as such, and not editable
 * here; adding a limit of the same metric and window overrides one. money names the
 * metrics that are money: their limits are shown and typed in their currency (without
 * it, as while usage loads or when it cannot be read, they are micro-units).
 */
export function LimitsEditor({ label, idPrefix, list, limits, canEdit, onSave, defaults, money = {} }: {
  label: string; idPrefix: string; list: ListName; limits: Limit[]; canEdit: boolean;
  onSave: (next: Limit[]) => Promise<void>;
  defaults?: { limits: Limit[]; from: string };
  money?: Money;
}) {
  const [editing, setEditing] = useState<string | null>(null); // "metric/window"
  const [adding, setAdding] = useState(false);
  const sorted = sortLimits(limits);
  const inherited = sortLimits((defaults?.limits ?? []).filter((d) => !limits.some((l) => l.metric === d.metric && l.window === d.window)));
  const cols = canEdit ? 4 : 3;
  return (
    <div class="limits">
      <table>
        <caption><IdText text={label} /></caption>
        <thead><tr><th scope="col">Metric</th><th scope="col">Window</th><th scope="col">Limit</th>{canEdit && <th scope="col"><span class="sr-only">Actions</span></th>}</tr></thead>
        <tbody>
          {sorted.length === 0 && inherited.length === 0 && <tr><td colSpan={cols} class="muted">No limits: {list === 'user_limits' ? 'users get no default allocation' : 'only the levels above apply'}.</td></tr>}
          {sorted.map((l) => {
            const key = `${l.metric}/${l.window}`;
            return editing === key
              ? <EditRow key={key} idPrefix={idPrefix} list={list} limits={limits} l={l} currency={money[l.metric]} onSave={onSave} onDone={() => setEditing(null)} />
              : (
                <tr key={key}>
                  <td>{l.metric}</td><td>{l.window}</td>
                  <td class="num">{canEdit
                    ? <button type="button" class="inline-edit" aria-label={`Edit ${l.metric} per ${l.window} limit of ${label}`} onClick={() => setEditing(key)}>{limitLabel(l, money[l.metric])}</button>
                    : limitLabel(l, money[l.metric])}</td>
                  {canEdit && <td class="row-actions"><RemoveLimit label={label} l={l} limits={limits} onSave={onSave} /></td>}
                </tr>
              );
          })}
          {inherited.map((l) => (
            <tr key={`default-${l.metric}/${l.window}`} class="inherited" data-testid="inherited-limit">
              <td>{l.metric}</td><td>{l.window}</td>
              <td class="num">{limitLabel(l, money[l.metric])}</td>
              {canEdit && <td class="muted small">default</td>}
            </tr>
          ))}
        </tbody>
      </table>
      {inherited.length > 0 && <p class="muted small">{sorted.length === 0 ? 'No limits of its own: ' : 'Where it has none of its own, '}{defaults!.from} apply.</p>}
      {canEdit && (adding
        ? <AddLimit idPrefix={idPrefix} list={list} limits={limits} money={money} onSave={onSave} onDone={() => setAdding(false)} />
        : <button type="button" class="link" onClick={() => setAdding(true)}>+ Add a limit to <IdText text={label[0].toLowerCase() + label.slice(1)} /></button>)}
    </div>
  );
}

// EditRow and AddLimit keep the currencies they opened with: usage (and so money) may
// arrive while a field is open, and what was typed as micro-units must not be read as
// an amount of currency, nor the other way round.
function EditRow({ idPrefix, list, limits, l, currency: opened, onSave, onDone }: {
  idPrefix: string; list: ListName; limits: Limit[]; l: Limit; currency?: string; onSave: (next: Limit[]) => Promise<void>; onDone: () => void;
}) {
  const [currency] = useState(opened);
  const [value, setValue] = useState(currency ? formatMicrosExact(l.limit, true) : String(l.limit));
  const [burst, setBurst] = useState(l.burst ? (currency ? formatMicrosExact(l.burst, true) : String(l.burst)) : '');
  const [error, setError] = useState<string>();
  const [burstError, setBurstError] = useState<string>();
  const [busy, setBusy] = useState(false);
  const id = `${idPrefix}-${list}-${l.metric}-${l.window}`;
  const save = async () => {
    const p = parseLimitIn(value, currency);
    if (p.error) { setError(p.error); return; }
    const b = bucketable(l.window) ? parseBurst(burst, currency) : {};
    if (b.error) { setBurstError(b.error); return; }
    const next = setLimit(limits, l.metric, l.window, p.value!, b.value);
    setBusy(true);
    try { await onSave(next); onDone(); } catch (e) {
      const errs = saveErrors(e, list, next, l.metric, l.window);
      setError(errs.limit); setBurstError(errs.burst); setBusy(false);
    }
  };
  return (
    <tr class="editing">
      <td>{l.metric}</td><td>{l.window}</td>
      <td colSpan={2}>
        <form class="inline-form" onSubmit={(e) => { e.preventDefault(); void save(); }}>
          <label class="sr-only" for={id}>{`${l.metric} per ${l.window} limit${currency ? ` in ${currency}` : ''}`}</label>
          <input id={id} name="limit" inputMode={currency ? 'decimal' : 'numeric'} value={value} autoFocus aria-invalid={error ? 'true' : undefined}
            aria-describedby={error ? `${id}-error` : undefined}
            onInput={(e) => { setValue((e.target as HTMLInputElement).value); setError(undefined); }}
            onKeyDown={(e) => { if (e.key === 'Escape') onDone(); }} />
          {currency && <span class="unit" aria-hidden="true">{currency}</span>}
          {bucketable(l.window) && <BurstInput id={`${id}-burst`} value={burst} error={burstError} currency={currency}
            onInput={(v) => { setBurst(v); setBurstError(undefined); }} />}
          <button type="submit" class="primary" disabled={busy}>Save</button>
          <button type="button" onClick={onDone}>Cancel</button>
          {error && <p id={`${id}-error`} class="field-error" role="alert">{error}</p>}
        </form>
      </td>
    </tr>
  );
}

function RemoveLimit({ label, l, limits, onSave }: { label: string; l: Limit; limits: Limit[]; onSave: (next: Limit[]) => Promise<void> }) {
  const [error, setError] = useState<string>();
  return (
    <>
      <button type="button" class="icon" aria-label={`Remove the ${l.metric} per ${l.window} limit of ${label}`}
        onClick={async () => { try { await onSave(setLimit(limits, l.metric, l.window, null)); } catch (e) { setError(errorFor(e, '')); } }}>✕</button>
      {error && <p class="field-error" role="alert">{error}</p>}
    </>
  );
}

function AddLimit({ idPrefix, list, limits, money: opened, onSave, onDone }: {
  idPrefix: string; list: ListName; limits: Limit[]; money: Money; onSave: (next: Limit[]) => Promise<void>; onDone: () => void;
}) {
  const [money] = useState(opened);
  const [metric, setMetric] = useState('requests');
  const [window, setWindow] = useState<Window>('month');
  const [value, setValue] = useState('');
  const [burst, setBurst] = useState('');
  const [error, setError] = useState<string>();
  const [burstError, setBurstError] = useState<string>();
  const id = `${idPrefix}-${list}-new`;
  const currency = money[metric.trim()];
  return (
    <form class="add-limit" onSubmit={async (e) => {
      e.preventDefault();
      const p = parseLimitIn(value, currency);
      if (!metric.trim()) { setError('Enter a metric.'); return; }
      if (p.error) { setError(p.error); return; }
      const b = bucketable(window) ? parseBurst(burst, currency) : {};
      if (b.error) { setBurstError(b.error); return; }
      const next = setLimit(limits, metric.trim(), window, p.value!, b.value);
      try { await onSave(next); onDone(); } catch (err) {
        const errs = saveErrors(err, list, next, metric.trim(), window);
        setError(errs.limit); setBurstError(errs.burst);
      }
    }}>
      <label>Metric <input name="metric" value={metric} onInput={(e) => setMetric((e.target as HTMLInputElement).value)} /></label>
      <label>Window <select name="window" value={window} onChange={(e) => setWindow((e.target as HTMLSelectElement).value as Window)}>
        {WINDOWS.map((w) => <option value={w}>{w}</option>)}</select></label>
      <label for={id}>Limit{currency && <span class="sr-only"> in {currency}</span>}</label>
      <input id={id} name="limit" inputMode={currency ? 'decimal' : 'numeric'} value={value} placeholder={currency ? 'e.g. 500.00' : 'e.g. 5000'}
        aria-invalid={error ? 'true' : undefined} aria-describedby={error ? `${id}-error` : undefined}
        onInput={(e) => { setValue((e.target as HTMLInputElement).value); setError(undefined); }} />
      {currency && <span class="unit" aria-hidden="true">{currency}</span>}
      {bucketable(window) && <BurstInput id={`${id}-burst`} value={burst} error={burstError} currency={currency}
        onInput={(v) => { setBurst(v); setBurstError(undefined); }} />}
      <button type="submit" class="primary">Add</button>
      <button type="button" onClick={onDone}>Cancel</button>
      {error && <p id={`${id}-error`} class="field-error" role="alert">{error}</p>}
    </form>
  );
}
