//! The lexer: tokens, numbers with size units, version literals.

use super::{ParseError, Span};

// ---------------------------------------------------------------- lexer

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Tok {
    Num(f64),
    Ident(String),
    Op(&'static str),
    LParen,
    RParen,
    Comma,
    End,
}

pub(super) fn lex(src: &str) -> Result<Vec<(Tok, Span)>, ParseError> {
    let bytes = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if c.is_ascii_digit() || (c == b'.' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit)) {
            while i < bytes.len()
                && (bytes[i].is_ascii_digit() || bytes[i] == b'.' || bytes[i] == b'_')
            {
                i += 1;
            }
            let digits: String = src[start..i].chars().filter(|&c| c != '_').collect();
            let value: f64 = digits.parse().map_err(|_| ParseError {
                message: format!("invalid number '{}'", &src[start..i]),
                span: Span { start, end: i },
            })?;
            let unit_start = i;
            while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
                i += 1;
            }
            let unit = &src[unit_start..i];
            let value = if unit.is_empty() {
                value
            } else {
                match size_unit(unit) {
                    Some(m) => value * m,
                    None => {
                        return Err(ParseError {
                            message: format!(
                                "unknown size unit '{unit}' (use B, KiB, MiB, GiB, TiB, PiB, EiB)"
                            ),
                            span: Span {
                                start: unit_start,
                                end: i,
                            },
                        });
                    }
                }
            };
            out.push((Tok::Num(value), Span { start, end: i }));
            continue;
        }
        if c == b'v' && bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
            // Version literal v2.1 → 201 (major × 100 + minor), the encoding of `torch_version`.
            i += 1;
            let major_start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            let major: u32 = src[major_start..i].parse().unwrap_or(0);
            let mut minor = 0u32;
            if bytes.get(i) == Some(&b'.') {
                i += 1;
                let minor_start = i;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
                minor = src[minor_start..i].parse().unwrap_or(0);
            }
            if minor >= 100 || major >= 1000 {
                return Err(ParseError {
                    message: format!("invalid version literal '{}'", &src[start..i]),
                    span: Span { start, end: i },
                });
            }
            out.push((
                Tok::Num(f64::from(major * 100 + minor)),
                Span { start, end: i },
            ));
            continue;
        }
        if c.is_ascii_alphabetic() || c == b'_' {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &src[start..i];
            let tok = match word {
                "and" => Tok::Op("and"),
                "or" => Tok::Op("or"),
                "not" => Tok::Op("not"),
                _ => Tok::Ident(word.to_string()),
            };
            out.push((tok, Span { start, end: i }));
            continue;
        }
        let two = src.get(i..i + 2).unwrap_or("");
        let (tok, len) = match two {
            "<=" => (Tok::Op("<="), 2),
            ">=" => (Tok::Op(">="), 2),
            "==" => (Tok::Op("=="), 2),
            "!=" => (Tok::Op("!="), 2),
            "&&" => (Tok::Op("and"), 2),
            "||" => (Tok::Op("or"), 2),
            _ => match c {
                b'+' => (Tok::Op("+"), 1),
                b'-' => (Tok::Op("-"), 1),
                b'*' => (Tok::Op("*"), 1),
                b'/' => (Tok::Op("/"), 1),
                b'<' => (Tok::Op("<"), 1),
                b'>' => (Tok::Op(">"), 1),
                b'!' => (Tok::Op("not"), 1),
                b'(' => (Tok::LParen, 1),
                b')' => (Tok::RParen, 1),
                b',' => (Tok::Comma, 1),
                _ => {
                    let ch = src[i..].chars().next().unwrap_or('?');
                    return Err(ParseError {
                        message: format!("unexpected character '{ch}'"),
                        span: Span {
                            start,
                            end: i + ch.len_utf8(),
                        },
                    });
                }
            },
        };
        i += len;
        out.push((tok, Span { start, end: i }));
    }
    out.push((
        Tok::End,
        Span {
            start: src.len(),
            end: src.len(),
        },
    ));
    Ok(out)
}

fn size_unit(unit: &str) -> Option<f64> {
    Some(match unit {
        "B" => 1.0,
        "KiB" | "KB" | "K" => 1024.0,
        "MiB" | "MB" | "M" => 1048576.0,
        "GiB" | "GB" | "G" => 1073741824.0,
        "TiB" | "TB" | "T" => 1099511627776.0,
        "PiB" | "PB" => 1125899906842624.0,
        "EiB" | "EB" => 1152921504606846976.0,
        _ => return None,
    })
}
