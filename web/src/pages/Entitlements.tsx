// Entitlements: the org's features, as its plan sets them and the operator overrides
// them, and what they resolve to. Read-only: only the operator changes them.
import { api, type FeatureValue, type OrgFeatures } from '../api';
import { formatNumber } from '../format';
import { Empty, ErrorState, Id, IdText, Loading, useLoad } from '../ui';
import type { PageProps } from '../ui';

/** EntitlementsLink goes to the page without reloading the console (App listens to popstate), as the shadow report's link does. */
export function EntitlementsLink() {
  const href = '/console/entitlements';
  return (
    <a class="small" href={href} data-testid="entitlements-link" onClick={(e) => {
      if (e.metaKey || e.ctrlKey || e.shiftKey || e.button !== 0) return;
      e.preventDefault();
      history.pushState(null, '', href);
      window.dispatchEvent(new PopStateEvent('popstate'));
    }}>Entitlements →</a>
  );
}

/** featureText writes a feature's value as the console shows it: yes/no, a number with separators, or the string. */
export function featureText(v: FeatureValue | null | undefined): string {
  if (v === undefined) return '—';
  if (v === null) return 'removed';
  if (typeof v === 'boolean') return v ? 'yes' : 'no';
  if (typeof v === 'number') return formatNumber(v);
  return v;
}

/** FeatureRow is one feature of the table: its resolved value (undefined: removed for this org), the plan's, and the override. */
export interface FeatureRow { name: string; value?: FeatureValue; source?: 'plan' | 'org'; plan?: FeatureValue; override?: FeatureValue | null; overridden: boolean }

/** featureRows lists every feature the plan or the overrides name, by name, resolved ones first. */
export function featureRows(f: OrgFeatures): FeatureRow[] {
  const names = new Set([...Object.keys(f.plan_features), ...Object.keys(f.overrides)]);
  return [...names].map((name): FeatureRow => ({
    name,
    value: f.features[name],
    source: f.sources[name],
    plan: f.plan_features[name],
    override: f.overrides[name],
    overridden: name in f.overrides,
  })).sort((a, b) => Number(a.value === undefined) - Number(b.value === undefined) || a.name.localeCompare(b.name));
}

export function Entitlements({ session }: PageProps) {
  const org = session.org;
  const data = useLoad(() => api.features(org), [org]);
  if (data.loading && !data.data) return <Loading what="the entitlements" />;
  if (data.error) return <ErrorState error={data.error} retry={data.reload} />;
  const f = data.data!;
  const rows = featureRows(f);
  return (
    <>
      <div class="page-head"><h1>Entitlements</h1><button type="button" onClick={data.reload} disabled={data.loading}>Refresh</button></div>
      <p class="muted">The features of plan <strong data-testid="features-plan"><Id id={f.plan} /></strong> with the overrides set for <Id id={f.org} />, as
        your services read them (<code>GET /v1/entitlements</code>, the clients' <code>entitled</code> and <code>feature</code>).
        Only the operator changes them.</p>
      {rows.length === 0 ? <Empty>The plan has no features and the org no overrides.</Empty> : (
        <div class="table-wrap"><table data-testid="features">
          <thead><tr><th scope="col">Feature</th><th scope="col">Value</th><th scope="col">From</th><th scope="col">Plan's value</th></tr></thead>
          <tbody>{rows.map((r) => (
            <tr data-testid={`feature-${r.name}`} class={r.value === undefined ? 'muted' : undefined}>
              <td><code>{r.name}</code></td>
              <td data-testid={`feature-value-${r.name}`}>{r.value === undefined ? <span class="muted">removed for this org</span>
                : typeof r.value === 'boolean' ? <span class={`badge ${r.value ? 'feature-on' : 'feature-off'}`}>{featureText(r.value)}</span>
                  : <strong><IdText text={featureText(r.value)} /></strong>}</td>
              <td data-testid={`feature-source-${r.name}`}>{r.overridden ? 'org override' : 'plan'}</td>
              <td class="muted">{r.plan === undefined ? 'not in the plan' : <IdText text={featureText(r.plan)} />}</td>
            </tr>
          ))}</tbody>
        </table></div>
      )}
    </>
  );
}
