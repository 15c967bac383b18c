package quota

import (
	"cmp"
	"container/heap"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// orgLabels chooses the orgs that have a series of their own in
// quotaplane_org_checks_total: at most max of them on a replica, the others counted as
// "_other" (OtherOrgs). The labels move to the busiest orgs, so a busy tenant that
// arrives late does not stay in "_other".
//
// The first orgs checked take the free labels. Once they are taken, the checks of
// "_other" are counted per org in a space-saving sketch (Metwally et al.: 2*max entries
// at most; a new org takes the place of the entry with the smallest count, inheriting
// it as its possible error), and each named org counts its checks of the window. At the
// end of each window (1 minute by default) the busiest orgs of the sketch take the
// labels of the quietest named orgs, when their count of the window (less its possible
// error) is more than twice the named org's: a busy late org gets its own series within
// a window or two, and two orgs of similar volume do not swap labels back and forth. At
// most max/10 labels (at least 1) change per window, so the series churn is bounded: a
// demoted org's series are deleted (its history stays in Prometheus; a later series of
// it starts again at 0, which rate() reads as a reset).
//
// The hot path of a named org is a read lock and two atomic adds; a check of "_other"
// also takes the sketch's mutex and costs O(log max): the sketch's entries are a
// min-heap by count, so the entry a new org replaces is found without a scan of the
// 2*max entries, which checks spread over thousands of orgs would pay on every check
// (BenchmarkOrgLabelsSpread).
type orgLabels struct {
	vec    *prometheus.CounterVec
	max    int
	window time.Duration
	now    func() time.Time

	mu    sync.RWMutex
	named map[string]*orgSeries
	other *orgSeries

	sketchMu sync.Mutex
	sketch   map[string]*sketchEntry // of "_other"'s orgs in this window, at most 2*max
	byCount  sketchHeap              // the same entries, a min-heap by count
	next     atomic.Int64            // end of the window, in Unix nanoseconds
}

type orgSeries struct {
	byDecision [3]prometheus.Counter // allowed, denied, error
	recent     atomic.Int64          // checks of the window
}

type sketchEntry struct {
	org        string
	count, err int64
	at         int // index in byCount
}

// sketchHeap is a min-heap of sketch entries by count (container/heap).
type sketchHeap []*sketchEntry

func (h sketchHeap) Len() int           { return len(h) }
func (h sketchHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h sketchHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}
func (h *sketchHeap) Push(x any) {
	e := x.(*sketchEntry)
	e.at = len(*h)
	*h = append(*h, e)
}
func (h *sketchHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

func decisionIndex(d string) int {
	switch d {
	case "denied":
		return 1
	case "error":
		return 2
	}
	return 0
}

func newOrgLabels(vec *prometheus.CounterVec, max int, window time.Duration) *orgLabels {
	if window <= 0 {
		window = time.Minute
	}
	l := &orgLabels{vec: vec, max: max, window: window, now: time.Now, named: map[string]*orgSeries{},
		sketch: map[string]*sketchEntry{}}
	l.other = l.series(OtherOrgs)
	l.next.Store(l.now().Add(window).UnixNano())
	return l
}

// series creates the series of org for every decision, at 0.
func (l *orgLabels) series(org string) *orgSeries {
	s := &orgSeries{}
	for i, d := range decisions {
		s.byDecision[i] = l.vec.WithLabelValues(org, d)
	}
	return s
}

// count counts one check of org.
func (l *orgLabels) count(org, decision string) {
	l.mu.RLock()
	s := l.named[org]
	l.mu.RUnlock()
	if s == nil {
		s = l.name(org)
	}
	s.byDecision[decisionIndex(decision)].Inc()
	if s == l.other {
		l.note(org)
	} else {
		s.recent.Add(1)
	}
	if now := l.now().UnixNano(); now >= l.next.Load() {
		if next := l.next.Load(); now >= next && l.next.CompareAndSwap(next, now+int64(l.window)) {
			l.rotate()
		}
	}
}

// name gives org a label if one is free, else returns "_other"'s series.
func (l *orgLabels) name(org string) *orgSeries {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.named[org]; s != nil {
		return s
	}
	if len(l.named) >= l.max || org == "" || org == OtherOrgs {
		return l.other
	}
	s := l.series(org)
	l.named[org] = s
	return s
}

// note counts a check of org, which has no label, in the sketch.
func (l *orgLabels) note(org string) {
	if l.max == 0 || org == "" || org == OtherOrgs {
		return
	}
	l.sketchMu.Lock()
	defer l.sketchMu.Unlock()
	if e := l.sketch[org]; e != nil {
		e.count++
		heap.Fix(&l.byCount, e.at)
		return
	}
	if len(l.sketch) < 2*l.max {
		e := &sketchEntry{org: org, count: 1}
		l.sketch[org] = e
		heap.Push(&l.byCount, e)
		return
	}
	// The entry with the smallest count makes room: the new org inherits its count as
	// its possible error.
	e := l.byCount[0]
	delete(l.sketch, e.org)
	e.org, e.err, e.count = org, e.count, e.count+1
	l.sketch[org] = e
	heap.Fix(&l.byCount, 0)
}

// rotate ends a window: the busiest orgs of "_other" take the labels of the quietest
// named orgs (see orgLabels), and every count starts again.
func (l *orgLabels) rotate() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sketchMu.Lock()
	sketch := l.sketch
	l.sketch, l.byCount = map[string]*sketchEntry{}, nil
	l.sketchMu.Unlock()

	type cand struct {
		org   string
		count int64
	}
	var busy, quiet []cand
	for o, e := range sketch {
		if sure := e.count - e.err; sure > 0 {
			busy = append(busy, cand{o, sure})
		}
	}
	for o, s := range l.named {
		quiet = append(quiet, cand{o, s.recent.Swap(0)})
	}
	slices.SortFunc(busy, func(a, b cand) int { return cmp.Compare(b.count, a.count) })
	slices.SortFunc(quiet, func(a, b cand) int { return cmp.Compare(a.count, b.count) })
	churn := max(l.max/10, 1)
	for i := 0; i < len(busy) && i < len(quiet) && i < churn; i++ {
		if busy[i].count <= 2*quiet[i].count {
			break
		}
		for _, d := range decisions {
			l.vec.DeleteLabelValues(quiet[i].org, d)
		}
		delete(l.named, quiet[i].org)
		l.named[busy[i].org] = l.series(busy[i].org)
	}
}
