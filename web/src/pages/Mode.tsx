// The enforcement mode: enforce, shadow or warn.
import { useState } from 'preact/hooks';
import { api, MODES, type Mode } from '../api';
import { Confirm, ErrorState, Loading, useLoad } from '../ui';
import type { PageProps } from '../ui';
import { ReportLink } from './ShadowReport';

const MODE_HELP: Record<Mode, string> = {
  enforce: 'Checks over a limit are denied with 429.',
  shadow: 'Nothing is denied; answers report what would have been blocked.',
  warn: 'Nothing is denied; answers over a limit carry a warning header.',
};

export function ModeSettings({ session }: PageProps) {
  const org = useLoad(() => api.org(session.org), [session.org]);
  const [pick, setPick] = useState<Mode>();
  const canEdit = session.role === 'admin';
  if (org.loading && !org.data) return <Loading what="the org" />;
  if (org.error) return <ErrorState error={org.error} retry={org.reload} />;
  const o = org.data!;
  return (
    <>
      <div class="page-head"><h1>Enforcement mode</h1></div>
      <div class="panel">
        <p>Current mode: <strong data-testid="current-mode">{o.mode}</strong>. {MODE_HELP[o.mode]} All modes count usage.</p>
        <p><ReportLink>See who enforcing would block</ReportLink>: the checks shadow and warn let through over a limit, per team, user and day.</p>
        {canEdit ? (
          <fieldset><legend>Switch the mode</legend>
            {MODES.map((m) => (
              <div class="mode-choice">
                <button type="button" disabled={m === o.mode} aria-pressed={m === o.mode} onClick={() => setPick(m)}>
                  {m === o.mode ? `${m} (current)` : `Switch to ${m}`}</button>
                <span class="muted">{MODE_HELP[m]}</span>
              </div>
            ))}
          </fieldset>
        ) : <p class="muted">Viewers cannot change the mode.</p>}
      </div>
      {pick && <Confirm title={`Switch ${o.id} to ${pick}?`} confirmLabel={`Switch to ${pick}`} danger={pick !== 'enforce'}
        body={<p>{MODE_HELP[pick]} Every API replica applies it within a second.</p>}
        onConfirm={async () => { await api.setMode(o.id, pick); org.reload(); }} onClose={() => setPick(undefined)} />}
    </>
  );
}
