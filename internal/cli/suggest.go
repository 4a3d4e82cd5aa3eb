package cli

// Suggest returns the name in names that s most likely misspells, or ""
// when none is close: at most one edit away (a letter added, dropped,
// changed, or two neighbours swapped), two for names of five letters or
// more. For "did you mean" in usage errors.
func Suggest(s string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		limit := 1
		if len(n) >= 5 {
			limit = 2
		}
		if d := osaDistance(s, n); d <= limit && d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// osaDistance is the optimal string alignment distance: Levenshtein's,
// with a swap of adjacent bytes counting as one edit.
func osaDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99
	}
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
