//! How the tools write numbers for people.

/// `512 B`, `1.5 KiB`, `3.0 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// `45s`, `3m 5s`, `2h 3m`, `4d 2h`: the two largest units.
pub fn duration(seconds: u64) -> String {
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds / 3_600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_durations() {
        let cases = [
            (0, "0 B"),
            (1023, "1023 B"),
            (1536, "1.5 KiB"),
            (3 << 30, "3.0 GiB"),
        ];
        for (n, want) in cases {
            assert_eq!(bytes(n), want);
        }
        let cases = [
            (0, "0s"),
            (59, "59s"),
            (185, "3m 5s"),
            (7_380, "2h 3m"),
            (353_000, "4d 2h"),
        ];
        for (n, want) in cases {
            assert_eq!(duration(n), want);
        }
    }
}
