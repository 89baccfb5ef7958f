//! The C++ standard-library number conversions PyTorch's config parsers call
//! (`std::stoi`, `std::stoul`, `std::stoull`, `std::stod`, libstdc++), with
//! their prefix parsing, sign wrapping and exception texts: a value such as
//! `40abc` parses as 40, `-1` as a huge unsigned number, `none` throws.

/// Why a conversion threw: libstdc++ throws `std::invalid_argument` (no digits)
/// or `std::out_of_range` (ERANGE), both with the function name as `what()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CppThrow {
    InvalidArgument,
    OutOfRange,
}

/// The result of a conversion: the value and whether characters after the
/// number were silently ignored (`40abc`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Converted<T> {
    pub value: T,
    pub ignored_tail: bool,
}

/// `isspace` in the C locale: space, \t, \n, \v, \f, \r.
pub fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// Leading whitespace and an optional sign, as strtol/strtoul/strtod skip them.
fn skip_space_and_sign(s: &[u8]) -> (usize, bool) {
    let mut i = 0;
    while i < s.len() && is_c_space(s[i]) {
        i += 1;
    }
    let mut negative = false;
    if let Some(&c) = s.get(i)
        && (c == b'+' || c == b'-')
    {
        negative = c == b'-';
        i += 1;
    }
    (i, negative)
}

/// Base-10 digits from `start`: (magnitude saturated at u128, index after the
/// digits, count of digits).
fn digits(s: &[u8], start: usize) -> (u128, usize, usize) {
    let mut i = start;
    let mut v: u128 = 0;
    while let Some(&c) = s.get(i) {
        if !c.is_ascii_digit() {
            break;
        }
        v = v.saturating_mul(10).saturating_add(u128::from(c - b'0'));
        i += 1;
    }
    (v, i, i - start)
}

/// `std::stoi`, returned as the `size_t` PyTorch assigns it to (a negative int
/// sign-extends to a huge value).
pub fn stoi_as_size_t(s: &str) -> Result<Converted<u64>, CppThrow> {
    let b = s.as_bytes();
    let (start, negative) = skip_space_and_sign(b);
    let (mag, end, n) = digits(b, start);
    if n == 0 {
        return Err(CppThrow::InvalidArgument);
    }
    // strtol saturates at LONG range with ERANGE; stoi then rejects anything
    // outside int: both end as out_of_range.
    let limit: u128 = if negative { 1 << 31 } else { (1 << 31) - 1 };
    if mag > limit {
        return Err(CppThrow::OutOfRange);
    }
    let v = if negative { -(mag as i64) } else { mag as i64 };
    Ok(Converted {
        value: v as u64,
        ignored_tail: end < b.len(),
    })
}

/// `std::stoul` / `std::stoull` (64-bit `unsigned long` on Linux): a leading
/// `-` negates modulo 2^64, as strtoul does.
pub fn stoull(s: &str) -> Result<Converted<u64>, CppThrow> {
    let b = s.as_bytes();
    let (start, negative) = skip_space_and_sign(b);
    let (mag, end, n) = digits(b, start);
    if n == 0 {
        return Err(CppThrow::InvalidArgument);
    }
    if mag > u128::from(u64::MAX) {
        return Err(CppThrow::OutOfRange);
    }
    let m = mag as u64;
    Ok(Converted {
        value: if negative { m.wrapping_neg() } else { m },
        ignored_tail: end < b.len(),
    })
}

/// `std::stod`: decimal and hexadecimal floats, `inf`/`infinity`/`nan` (any
/// case), longest valid prefix; ERANGE (overflow or underflow) → out_of_range.
pub fn stod(s: &str) -> Result<Converted<f64>, CppThrow> {
    let b = s.as_bytes();
    let (start, negative) = skip_space_and_sign(b);
    let rest = &b[start..];
    let lower = |n: usize| -> Vec<u8> { rest.iter().take(n).map(u8::to_ascii_lowercase).collect() };
    let (magnitude, used) = if lower(8) == b"infinity" {
        (f64::INFINITY, 8)
    } else if lower(3) == b"inf" {
        (f64::INFINITY, 3)
    } else if lower(3) == b"nan" {
        // `nan(chars)` is consumed whole when the parenthesis closes.
        let mut used = 3;
        if rest.get(3) == Some(&b'(')
            && let Some(close) = rest[4..].iter().position(|&c| c == b')')
            && rest[4..4 + close]
                .iter()
                .all(|c| c.is_ascii_alphanumeric() || *c == b'_')
        {
            used = 4 + close + 1;
        }
        (f64::NAN, used)
    } else if rest.len() > 2
        && rest[0] == b'0'
        && (rest[1] | 0x20) == b'x'
        && hex_mantissa_len(&rest[2..]) > 0
    {
        let (v, n) = hex_float(&rest[2..]);
        (v, n + 2)
    } else {
        let n = decimal_float_len(rest);
        if n == 0 {
            return Err(CppThrow::InvalidArgument);
        }
        let text = std::str::from_utf8(&rest[..n]).map_err(|_| CppThrow::InvalidArgument)?;
        let v: f64 = text.parse().map_err(|_| CppThrow::InvalidArgument)?;
        let has_nonzero_digit = rest[..n]
            .iter()
            .take_while(|c| !matches!(c, b'e' | b'E'))
            .any(|c| (b'1'..=b'9').contains(c));
        if v.is_infinite() || (has_nonzero_digit && v.abs() < f64::MIN_POSITIVE) {
            return Err(CppThrow::OutOfRange);
        }
        (v, n)
    };
    let value = if negative { -magnitude } else { magnitude };
    Ok(Converted {
        value,
        ignored_tail: start + used < b.len(),
    })
}

/// Length of the longest prefix strtod accepts as a decimal float.
fn decimal_float_len(s: &[u8]) -> usize {
    let (_, mut i, int_digits) = digits(s, 0);
    let mut frac_digits = 0;
    if s.get(i) == Some(&b'.') {
        let (_, j, n) = digits(s, i + 1);
        frac_digits = n;
        if int_digits > 0 || n > 0 {
            i = j;
        }
    }
    if int_digits == 0 && frac_digits == 0 {
        return 0;
    }
    if matches!(s.get(i), Some(b'e' | b'E')) {
        let mut j = i + 1;
        if matches!(s.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let (_, k, n) = digits(s, j);
        if n > 0 {
            i = k;
        }
    }
    i
}

fn hex_mantissa_len(s: &[u8]) -> usize {
    let int = s.iter().take_while(|c| c.is_ascii_hexdigit()).count();
    let frac = if s.get(int) == Some(&b'.') {
        s[int + 1..]
            .iter()
            .take_while(|c| c.is_ascii_hexdigit())
            .count()
    } else {
        0
    };
    if int + frac == 0 {
        0
    } else if frac > 0 || s.get(int) == Some(&b'.') {
        int + 1 + frac
    } else {
        int
    }
}

/// A hexadecimal float after `0x`: (value, bytes consumed).
fn hex_float(s: &[u8]) -> (f64, usize) {
    let n = hex_mantissa_len(s);
    let mut value = 0.0f64;
    let mut scale = 0i32;
    let mut seen_point = false;
    for &c in &s[..n] {
        if c == b'.' {
            seen_point = true;
            continue;
        }
        let d = f64::from((c as char).to_digit(16).unwrap_or(0));
        value = value * 16.0 + d;
        if seen_point {
            scale -= 4;
        }
    }
    let mut used = n;
    if matches!(s.get(n), Some(b'p' | b'P')) {
        let mut j = n + 1;
        let neg = s.get(j) == Some(&b'-');
        if matches!(s.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let (e, k, count) = digits(s, j);
        if count > 0 {
            let e = i32::try_from(e.min(100_000)).unwrap_or(100_000);
            scale = scale.saturating_add(if neg { -e } else { e });
            used = k;
        }
    }
    (value * 2f64.powi(scale), used)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stoi_prefix_sign_and_range() {
        assert_eq!(stoi_as_size_t("40").unwrap().value, 40);
        let c = stoi_as_size_t(" 40abc").unwrap();
        assert_eq!((c.value, c.ignored_tail), (40, true));
        assert_eq!(stoi_as_size_t("-1").unwrap().value, u64::MAX);
        assert_eq!(stoi_as_size_t("none"), Err(CppThrow::InvalidArgument));
        assert_eq!(stoi_as_size_t("2147483648"), Err(CppThrow::OutOfRange));
        assert_eq!(
            stoi_as_size_t("-2147483648").unwrap().value,
            (-2147483648i64) as u64
        );
    }

    #[test]
    fn stoull_wraps_negative() {
        assert_eq!(stoull("-1").unwrap().value, u64::MAX);
        assert_eq!(stoull("18446744073709551615").unwrap().value, u64::MAX);
        assert_eq!(stoull("18446744073709551616"), Err(CppThrow::OutOfRange));
        assert_eq!(stoull(""), Err(CppThrow::InvalidArgument));
    }

    #[test]
    fn stod_forms() {
        assert_eq!(stod("0.5").unwrap().value, 0.5);
        assert_eq!(stod(".5").unwrap().value, 0.5);
        assert_eq!(stod("5.").unwrap().value, 5.0);
        assert_eq!(stod("1e-1").unwrap().value, 0.1);
        let c = stod("1e").unwrap();
        assert_eq!((c.value, c.ignored_tail), (1.0, true));
        assert_eq!(stod("0x1p-1").unwrap().value, 0.5);
        assert!(stod("nan").unwrap().value.is_nan());
        assert_eq!(stod("-Infinity").unwrap().value, f64::NEG_INFINITY);
        assert_eq!(stod("1e400"), Err(CppThrow::OutOfRange));
        assert_eq!(stod("1e-400"), Err(CppThrow::OutOfRange));
        assert_eq!(stod("."), Err(CppThrow::InvalidArgument));
        assert_eq!(stod("none"), Err(CppThrow::InvalidArgument));
    }
}
