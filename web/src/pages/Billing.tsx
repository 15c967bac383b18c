// The billing export of a picked period as CSV or JSON.
import { useState } from 'preact/hooks';
import { api } from '../api';
import { recentPeriods } from '../format';
import type { PageProps } from '../ui';

export function Billing({ session }: PageProps) {
  const periods = recentPeriods(new Date(), 12);
  const [period, setPeriod] = useState(periods[0]);
  const [format, setFormat] = useState<'csv' | 'json'>('csv');
  const url = api.exportURL(session.org, period, format);
  return (
    <>
      <div class="page-head"><h1>Billing export</h1></div>
      <div class="panel">
        <p>One row per team, user and metric with the units used in the period, plus the org's totals with included units, overage and amount.</p>
        <div class="form-grid">
          <div class="field"><label for="period">Period</label>
            <select id="period" value={period} onChange={(e) => setPeriod((e.target as HTMLSelectElement).value)}>
              {periods.map((p, i) => <option value={p}>{p}{i === 0 ? ' (current)' : ''}</option>)}
            </select></div>
          <fieldset class="field"><legend>Format</legend>
            <label class="check"><input type="radio" name="format" value="csv" checked={format === 'csv'} onChange={() => setFormat('csv')} /> CSV</label>
            <label class="check"><input type="radio" name="format" value="json" checked={format === 'json'} onChange={() => setFormat('json')} /> JSON</label>
          </fieldset>
        </div>
        <div class="actions"><a class="button primary" href={url} download={`quotaplane-${session.org}-${period}.${format}`} data-testid="download">Download {format.toUpperCase()}</a></div>
      </div>
    </>
  );
}
