package mig

import "math/bits"

// gpuState is the exact occupancy of one GPU: which memory slots are taken,
// how many compute slices are in use and how many instances of each profile
// exist. It is a value type: copies are independent.
type gpuState struct {
	slots   uint8 // bit i set: memory slot i is taken
	compute int   // compute slices in use, at most ComputeSlices
	counts  [8]int8
	whole   bool // the GPU is allocated whole, outside MIG
}

// maxShapes guards counts' size at compile time.
var _ = [8]int8{}[len(shapes)]

// fits reports why profile p cannot start at start, or "" if it can.
func (s *gpuState) fits(p *Profile, start int) string {
	switch {
	case s.whole:
		return "gpu allocated whole"
	case !p.ValidStart(start):
		return "invalid placement"
	case s.slots&p.SlotMask(start) != 0:
		return "memory slots taken"
	case s.compute+p.Compute > ComputeSlices:
		return "compute slices exhausted"
	case int(s.counts[p.index]) >= p.Instances:
		return "instance limit reached"
	}
	return ""
}

func (s *gpuState) add(p *Profile, start int) {
	s.slots |= p.SlotMask(start)
	s.compute += p.Compute
	s.counts[p.index]++
}

func (s *gpuState) remove(p *Profile, start int) {
	s.slots &^= p.SlotMask(start)
	s.compute -= p.Compute
	s.counts[p.index]--
}

func (s *gpuState) empty() bool {
	return s.slots == 0 && !s.whole
}

// room is how many more instances of p fit on the GPU at once. The starts of
// one profile never overlap each other, so the free starts, the compute left
// and the instance limit bound it exactly.
func (s *gpuState) room(p *Profile) int {
	if s.whole {
		return 0
	}
	free := 0
	for _, st := range p.Starts {
		if s.slots&p.SlotMask(st) == 0 {
			free++
		}
	}
	if c := (ComputeSlices - s.compute) / p.Compute; c < free {
		free = c
	}
	if l := p.Instances - int(s.counts[p.index]); l < free {
		free = l
	}
	return free
}

// capacity is the future capacity the best-fit strategy preserves: for every
// profile, the compute it could still get if only that profile arrived from
// now on. Media variants are skipped: they duplicate the plain 1g profile.
func (s *gpuState) capacity(m *GPUModel) int {
	c := 0
	for i := range m.Profiles {
		p := &m.Profiles[i]
		if p.Media {
			continue
		}
		c += s.room(p) * p.Compute
	}
	return c
}

// largestFree is the most compute a single new instance could get.
func (s *gpuState) largestFree(m *GPUModel) int {
	best := 0
	for i := range m.Profiles {
		p := &m.Profiles[i]
		if p.Compute > best && s.room(p) > 0 {
			best = p.Compute
		}
	}
	return best
}

func (s *gpuState) usedSlots() int { return bits.OnesCount8(s.slots) }

// Occupancy is one GPU's exact occupancy for planners and simulators that
// search placements without an Allocator. The zero value is an empty GPU;
// values are comparable and usable as map keys.
type Occupancy struct{ s gpuState }

// Fits reports whether p can start at start, as hardware would decide.
func (o Occupancy) Fits(p *Profile, start int) bool { return o.s.fits(p, start) == "" }

// Add places p at start; the caller has checked Fits.
func (o *Occupancy) Add(p *Profile, start int) { o.s.add(p, start) }

// Remove frees p at start.
func (o *Occupancy) Remove(p *Profile, start int) { o.s.remove(p, start) }

// Room is how many more instances of p fit at once.
func (o Occupancy) Room(p *Profile) int { return o.s.room(p) }

// Compute is the compute slices in use.
func (o Occupancy) Compute() int { return o.s.compute }

// Empty reports whether nothing is placed.
func (o Occupancy) Empty() bool { return o.s.empty() }
