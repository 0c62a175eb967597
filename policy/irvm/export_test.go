package irvm

// CacheEveryRule makes Load give every rule that can have a cache one,
// however small, until the returned func is called.
func CacheEveryRule() (restore func()) {
	old := minCachedSize
	minCachedSize = 0
	return func() { minCachedSize = old }
}

// CachedRules lists the rules with a cache and the input paths of their keys.
func (p *Program) CachedRules() map[string]string {
	out := map[string]string{}
	for _, fn := range p.funcs {
		if fn.cache != nil {
			s := ""
			for _, d := range fn.cache.paths {
				s += d.path.String()
				if d.exists {
					s += "?"
				}
				s += " "
			}
			out[fn.name] = s
		}
	}
	return out
}
