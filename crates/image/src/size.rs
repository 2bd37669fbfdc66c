// SPDX-License-Identifier: Apache-2.0
//! Human sizes: `512`, `64K`, `256M`, `1G`, `2T` (binary units; a trailing `iB` or `B` is allowed).

/// Parses a size such as `256M` into bytes.
pub fn parse_size(s: &str) -> Result<u64, crate::Error> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, shift) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 30),
        Some('T' | 't') => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size: use a number with an optional K, M, G or T suffix, e.g. 256M"))?;
    Ok(n.checked_mul(1 << shift).ok_or_else(|| format!("{s:?} is too large"))?)
}

/// Formats bytes with a binary unit, e.g. `1.5 MiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512").unwrap(), 512);
        assert_eq!(parse_size("256M").unwrap(), 256 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert_eq!(human(1536 * 1024), "1.5 MiB");
    }
}
