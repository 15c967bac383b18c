package checks

// Money: a check of a metric its org's rates price also spends money, ceil(sum of cost
// x price / per) micro-units of the org's currency, as one more metric
// (tenants.SpendMetric) of the same decision: quota.Request.More, so check.lua counts
// it at every level in the same script run as the units, all or nothing.

import (
	"fmt"
	"math/big"
	"math/bits"

	"github.com/quotaplane/quotaplane/internal/derrors"
	"github.com/quotaplane/quotaplane/internal/quota"
	"github.com/quotaplane/quotaplane/internal/tenants"
	"github.com/quotaplane/quotaplane/internal/vocab"
)

// pricing is what a check is priced at: its org's rates (nil: none) and the spend
// limits of its path at each level, throttled as every limit is.
type pricing struct {
	rates  map[string]tenants.Rate
	limits quota.LevelLimits
}

// price adds req's spend to it, as one more metric, when its org's rates price a
// metric it checks; it changes nothing otherwise. Spend is a Derived metric, beside
// the quota.MaxMetrics a check may name. Errors (Invalid): spend named beside priced
// metrics, or a spend above vocab.MaxUnits micro-units.
func price(req *quota.Request, p pricing) error {
	if len(p.rates) == 0 {
		return nil
	}
	spend, priced, err := spendOf(req, p.rates)
	if !priced {
		return nil
	}
	if err != nil {
		return err
	}
	field := "metric"
	if len(req.More) > 0 {
		field = "costs"
	}
	if hasMetric(req, tenants.SpendMetric) {
		return derrors.Field(field, "spend is priced from the org's rates: name the metrics it prices, not spend")
	}
	req.More = append(req.More, quota.MetricCost{Metric: tenants.SpendMetric, Cost: spend, Limits: p.limits, Derived: true})
	return nil
}

func hasMetric(req *quota.Request, m string) bool {
	if req.Metric == m {
		return true
	}
	for _, x := range req.More {
		if x.Metric == m {
			return true
		}
	}
	return false
}

// spendOf is the spend of req's costs at rates: ceil(sum of cost x micros / per)
// micro-units, exact (128-bit for one priced metric, math/big for several: no float),
// and whether any of its metrics is priced. A spend above vocab.MaxUnits is an error.
func spendOf(req *quota.Request, rates map[string]tenants.Rate) (int64, bool, error) {
	var sum *big.Rat
	var one int64
	n := 0
	for i := range 1 + len(req.More) {
		metric, cost := req.Metric, req.Cost
		if i > 0 {
			metric, cost = req.More[i-1].Metric, req.More[i-1].Cost
		}
		r, ok := rates[metric]
		if !ok {
			continue
		}
		n++
		if n == 1 {
			v, ok := ceilMulDiv(uint64(cost), uint64(r.Micros), uint64(r.Per))
			if !ok {
				return 0, true, tooMuch(req)
			}
			one = v
			continue
		}
		if sum == nil { // several priced metrics: the exact sum of fractions, then one ceil
			sum = new(big.Rat)
			for j := range i {
				m, c := req.Metric, req.Cost
				if j > 0 {
					m, c = req.More[j-1].Metric, req.More[j-1].Cost
				}
				if pr, ok := rates[m]; ok {
					sum.Add(sum, big.NewRat(0, 1).SetFrac(new(big.Int).Mul(big.NewInt(c), big.NewInt(pr.Micros)), big.NewInt(pr.Per)))
				}
			}
		}
		sum.Add(sum, new(big.Rat).SetFrac(new(big.Int).Mul(big.NewInt(cost), big.NewInt(r.Micros)), big.NewInt(r.Per)))
	}
	if n == 0 {
		return 0, false, nil
	}
	if sum == nil {
		return one, true, nil
	}
	q, m := new(big.Int).QuoRem(sum.Num(), sum.Denom(), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() || q.Int64() > vocab.MaxUnits {
		return 0, true, tooMuch(req)
	}
	return q.Int64(), true, nil
}

// ceilMulDiv is ceil(a x b / d) in 128 bits, and false when it is above vocab.MaxUnits.
func ceilMulDiv(a, b, d uint64) (int64, bool) {
	hi, lo := bits.Mul64(a, b)
	if hi >= d {
		return 0, false
	}
	q, rem := bits.Div64(hi, lo, d)
	if rem > 0 {
		q++
	}
	if q > uint64(vocab.MaxUnits) {
		return 0, false
	}
	return int64(q), true
}

// tooMuch refuses a check whose spend passes the most a counter may take.
func tooMuch(req *quota.Request) error {
	field := "cost"
	if len(req.More) > 0 {
		field = "costs"
	}
	return derrors.Field(field, fmt.Sprintf("prices at more than %d micro-units of spend, the most one check may spend", vocab.MaxUnits))
}
