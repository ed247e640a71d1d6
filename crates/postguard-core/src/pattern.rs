//! Route patterns: `*` matches one or more characters (across `/`), anything
//! else matches itself. A pattern without `*` matches exactly.

/// Whether `path` matches `pattern`.
///
/// Iterative two-pointer glob with backtracking to the last `*`; O(n·m) worst
/// case, no recursion, no allocation.
pub fn matches(pattern: &str, path: &str) -> bool {
    let p = pattern.as_bytes();
    let s = path.as_bytes();
    let (mut pi, mut si) = (0usize, 0usize);
    // After the last `*`: the pattern index to resume at and the string index
    // the star has absorbed up to (exclusive). A star absorbs at least one byte.
    let mut star: Option<(usize, usize)> = None;
    loop {
        if pi < p.len() && p[pi] == b'*' {
            if si >= s.len() {
                return false;
            }
            star = Some((pi + 1, si + 1));
            pi += 1;
            si += 1;
            continue;
        }
        if si == s.len() && pi == p.len() {
            return true;
        }
        if pi < p.len() && si < s.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
            continue;
        }
        match star {
            Some((sp, absorbed)) if absorbed < s.len() => {
                star = Some((sp, absorbed + 1));
                pi = sp;
                si = absorbed + 1;
            }
            _ => return false,
        }
    }
}

/// A pattern is valid when it is non-empty, starts with `/`, and has no
/// control characters.
pub fn is_valid(pattern: &str) -> bool {
    pattern.starts_with('/')
        && pattern.len() <= 1024
        && pattern.bytes().all(|b| (0x21..0x7f).contains(&b))
}

#[cfg(test)]
mod tests {
    use super::matches;
    use proptest::prelude::*;

    #[test]
    fn exact_without_star() {
        assert!(matches("/search", "/search"));
        assert!(!matches("/search", "/search/x"));
        assert!(!matches("/search", "/searc"));
    }

    #[test]
    fn star_spans_one_or_more_chars_across_segments() {
        assert!(matches("/bulk/*", "/bulk/a"));
        assert!(matches("/bulk/*", "/bulk/a/b/c"));
        assert!(!matches("/bulk/*", "/bulk/"));
        assert!(!matches("/bulk/*", "/bulk"));
        assert!(matches("/v1/*/refunds", "/v1/ch_1/refunds"));
        assert!(matches("/v1/*/refunds", "/v1/a/b/refunds"));
        assert!(!matches("/v1/*/refunds", "/v1//refunds"));
        assert!(matches("*", "/"));
        assert!(matches("/a*b*c", "/axxbyyc"));
        assert!(!matches("/a*b*c", "/abc"));
    }

    /// Reference: regex-free recursive definition.
    fn reference(p: &[u8], s: &[u8]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some(b'*') => (1..=s.len()).any(|k| reference(&p[1..], &s[k..])),
            Some(c) => s.first() == Some(c) && reference(&p[1..], &s[1..]),
        }
    }

    proptest! {
        #[test]
        fn agrees_with_reference(p in "[ab*/]{0,7}", s in "[ab/]{0,9}") {
            prop_assert_eq!(matches(&p, &s), reference(p.as_bytes(), s.as_bytes()));
        }
    }
}
