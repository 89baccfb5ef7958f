//! Reads the comparison words of a rendered sentence and checks each against
//! the two figures it relates: the nearest size before the word in the same
//! sentence and the first size after it. Sizes are read as PyTorch's
//! `format_size` and allocdoc's `human` print them.

/// A comparison word and what it claims of (left, right).
const WORDS: [(&str, Claim); 12] = [
    ("more than", Claim::Greater),
    ("larger than", Claim::Greater),
    ("greater than", Claim::Greater),
    ("exceeds", Claim::Greater),
    ("exceed", Claim::Greater),
    ("less than", Claim::Less),
    ("smaller than", Claim::Less),
    ("as much as", Claim::Equal),
    ("could hold", Claim::AtLeast),
    ("cannot hold", Claim::Less),
    ("does not fit in", Claim::Greater),
    ("fits in", Claim::AtMost),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    Greater,
    Less,
    Equal,
    AtLeast,
    AtMost,
}

/// The sizes in `s` with their byte offsets: (start, end, bytes as printed).
fn sizes(s: &str) -> Vec<(usize, usize, f64)> {
    let units: [(&str, f64); 9] = [
        (" bytes", 1.0),
        (" B", 1.0),
        (" KiB", 1024.0),
        (" MiB", 1048576.0),
        (" GiB", 1073741824.0),
        (" TiB", 1099511627776.0),
        (" PiB", 1125899906842624.0),
        (" EiB", 1152921504606846976.0),
        (" KB", 1024.0),
    ];
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts_number = b[i].is_ascii_digit()
            && (i == 0 || !b[i - 1].is_ascii_alphanumeric() && b[i - 1] != b'.');
        if !starts_number {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_digit() || b[j] == b'.') {
            j += 1;
        }
        let number = s[i..j].trim_end_matches('.');
        let rest = &s[j..];
        let unit = units.iter().find(|(u, _)| {
            rest.starts_with(u)
                && rest[u.len()..]
                    .chars()
                    .next()
                    .is_none_or(|c| !c.is_ascii_alphanumeric())
        });
        if let (Some((u, m)), Ok(v)) = (unit, number.parse::<f64>()) {
            out.push((i, j + u.len(), v * m));
            i = j + u.len();
        } else {
            i = j;
        }
    }
    out
}

/// The sentence around byte `at`: from after the last ". " / "; " / ": "
/// before it to the next one after it.
fn sentence(s: &str, at: usize) -> (usize, usize) {
    let ends = [". ", "; ", ": "];
    let start = ends
        .iter()
        .filter_map(|e| s[..at].rfind(e).map(|i| i + e.len()))
        .max()
        .unwrap_or(0);
    let end = ends
        .iter()
        .filter_map(|e| s[at..].find(e).map(|i| at + i))
        .min()
        .unwrap_or(s.len());
    (start, end)
}

/// Every comparison word in `text` whose two figures disagree with it, as
/// one line each; comparisons without a figure on both sides are skipped.
/// Two figures printed alike are too close to tell apart and pass.
pub fn contradictions(text: &str) -> Vec<String> {
    let found = sizes(text);
    let mut out = Vec::new();
    for (word, claim) in WORDS {
        let mut from = 0;
        while let Some(i) = text[from..].find(word) {
            let at = from + i;
            from = at + word.len();
            // "exceed" inside "exceeds" is read once, as "exceeds".
            if word == "exceed" && text[at..].starts_with("exceeds") {
                continue;
            }
            let (start, end) = sentence(text, at);
            let left = found.iter().rev().find(|(a, b, _)| *a >= start && *b <= at);
            let right = found
                .iter()
                .find(|(a, _, _)| *a >= at + word.len() && *a < end);
            let (Some(&(ls, le, l)), Some(&(rs, re, r))) = (left, right) else {
                continue;
            };
            let same_print = text[ls..le] == text[rs..re];
            let holds = same_print
                || match claim {
                    Claim::Greater => l > r,
                    Claim::Less => l < r,
                    Claim::Equal => (l - r).abs() <= l.abs().max(r.abs()) * 0.005,
                    Claim::AtLeast => l >= r,
                    Claim::AtMost => l <= r,
                };
            if !holds {
                out.push(format!(
                    "'{}' {word} '{}' in: {text}",
                    &text[ls..le],
                    &text[rs..re]
                ));
            }
        }
    }
    out
}

#[test]
fn the_checker_reads_sizes_and_catches_inversions() {
    assert!(contradictions("6.20 GiB is reserved, more than the 2.00 GiB request.").is_empty());
    let bad = contradictions(
        "Live tensors hold 22 GiB and only 194.87 MiB is cached unused, less than the 22.00 MiB request: in use.",
    );
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].starts_with("'194.87 MiB' less than '22.00 MiB'"),
        "{bad:?}"
    );
    // Another sentence's figures are not related.
    assert!(contradictions("It holds 5.00 GiB. More than that: 1.00 GiB free.").is_empty());
    assert!(!contradictions("3.71 GiB cannot hold the 2.00 GiB request").is_empty());
    assert!(contradictions("1024.00 KiB is less than the 2.00 GiB request").is_empty());
}
