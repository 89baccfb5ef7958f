//! The trace CSV reader (`workload::trace`): errors that name the line and the
//! problem, a UTF-8 byte order mark, RFC 4180 quoting, numbered and named ids,
//! and a property test that the fast reader and a plain reference reading
//! written here agree on generated CSVs, formatting quirks and errors included.

use allocdoc::Error;
use allocdoc::workload::{Event, Trace};
use proptest::prelude::*;
use std::collections::HashMap;

fn parse(text: &str) -> Result<Trace, String> {
    Trace::parse("t.csv", text.as_bytes()).map_err(|e| match e {
        Error::Input(m) => m,
        other => panic!("not an input error: {other:?}"),
    })
}

fn events(text: &str) -> Vec<Event> {
    parse(text).expect("a valid trace").events().to_vec()
}

fn alloc(id: u32, size: u64, stream: u64) -> Event {
    Event::Alloc { id, size, stream }
}

#[test]
fn errors_name_the_file_the_line_and_the_problem() {
    let err = |text: &str| parse(text).expect_err(text);
    assert_eq!(
        err("action,id,size,stream\nalloc,a,1,0\nfree,b,,0\n"),
        "t.csv:3: expected the id of a live allocation, 'b' is not allocated, found \"free,b,,0\""
    );
    assert_eq!(
        err("action,id,size,stream\nalloc,t1,1,0\nalloc,t1,2,0\n"),
        "t.csv:3: expected a new id, 't1' is still allocated (free it first), found \"alloc,t1,2,0\""
    );
    assert_eq!(
        err("action,id,size,stream\n# c\n\nalloc,a,1,0,9\n"),
        "t.csv:4: expected 4 fields (action,id,size,stream), found \"alloc,a,1,0,9\""
    );
    assert_eq!(
        err("action,id,size,stream\nalloc,a,1,x\n"),
        "t.csv:2: expected an integer stream (or nothing for 0), found \"alloc,a,1,x\""
    );
    assert_eq!(
        err("action,id,size,stream\nalloc,a,18446744073709551616,0\n"),
        "t.csv:2: expected a size in bytes for alloc, found \"alloc,a,18446744073709551616,0\""
    );
    assert_eq!(
        err("action,id,size,stream\nalloc,,1,0\n"),
        "t.csv:2: expected an id, found \"alloc,,1,0\""
    );
    assert_eq!(
        err("action,id,size,stream\nmalloc,a,1,0\n"),
        "t.csv:2: expected an action: alloc, free, empty_cache (or record_stream, synchronize), found \"malloc,a,1,0\""
    );
    assert_eq!(
        err("action,id\nalloc,a\n"),
        "t.csv:1: expected the header line \"action,id,size,stream\", found \"action,id\""
    );
    assert_eq!(
        err("# only a comment\n"),
        "t.csv: expected a trace CSV starting with the header \"action,id,size,stream\""
    );
    // A canonical row (read by the fast path) and a padded one (the record
    // reader) fail alike.
    assert_eq!(
        err("action,id,size,stream\n free , b , , 0 \n"),
        "t.csv:2: expected the id of a live allocation, 'b' is not allocated, found \"free , b , , 0\""
    );
}

#[test]
fn quoting_errors_name_the_line_of_the_quote() {
    let err = |text: &str| parse(text).expect_err(text);
    assert_eq!(
        err("action,id,size,stream\nalloc,a,1,0\nalloc,\"b,2,0\nfree,a,,0\n"),
        "t.csv:3: expected a closing quote for the field opened on this line, found \"alloc,\\\"b,2,0\\nfree,a,,0\""
    );
    assert_eq!(
        err("action,id,size,stream\nalloc,\"b\"x,2,0\n"),
        "t.csv:2: expected a comma or the end of the line after a quoted field, found \"alloc,\\\"b\\\"x\""
    );
    assert!(
        err("action,id,size,stream\nalloc,\"multi\nline\",1,0\nalloc,b\"c,1,0\n")
            .starts_with("t.csv:4: expected a quote only around a whole field")
    );
}

#[test]
fn a_utf8_byte_order_mark_is_skipped() {
    let text = "\u{feff}action,id,size,stream\nalloc,a,512,0\nfree,a,,0\n";
    assert_eq!(events(text), vec![alloc(0, 512, 0), Event::Free { id: 0 }]);
    assert!(allocdoc::workload::trace::is_trace_csv(text.as_bytes()));
}

#[test]
fn quoted_fields_are_read_as_rfc_4180_says() {
    let text = concat!(
        "\"action\",\"id\",\"size\",\"stream\"\r\n",
        "alloc,\"a,b\",\"4096\",\"1\"\r\n",
        "alloc,\"say \"\"hi\"\"\",1,\r\n",
        "alloc,\"two\nlines\",2,0\r\n",
        "alloc,a,3,0\r\n", // `a` is not `"a,b"`
        "free,\"a,b\",,\r\n",
        "\"free\" , \"say \"\"hi\"\"\" ,,\r\n",
        "free,\"two\nlines\",,0\r\n",
        "free,\"a\",,0\r\n", // the same id as the unquoted `a`
    );
    assert_eq!(
        events(text),
        vec![
            alloc(0, 4096, 1),
            alloc(1, 1, 0),
            alloc(2, 2, 0),
            alloc(3, 3, 0),
            Event::Free { id: 0 },
            Event::Free { id: 1 },
            Event::Free { id: 2 },
            Event::Free { id: 3 },
        ]
    );
    // Line breaks inside quotes count: the next line is line 12.
    let bad = format!("{text}free,\"a\",,0\n");
    assert!(
        parse(&bad)
            .unwrap_err()
            .starts_with("t.csv:12: expected the id of a live allocation, 'a' is not allocated")
    );
}

#[test]
fn numbered_and_named_ids_are_dense_in_order_of_first_use() {
    let text = concat!(
        "action,id,size,stream\n",
        "alloc,t7,1,0\n",
        "alloc,t01,2,0\n", // not t1: a leading zero is another spelling, hashed
        "alloc,t1,3,0\n",
        "alloc,x,4,0\n",
        "alloc,7,5,0\n",            // no prefix: another id than t7
        "alloc,t99999999999,6,0\n", // past the number table: hashed, still one id
        "free,t99999999999,,0\n",
        "free,t7,,0\n",
        "free,t1,,0\n",
        "free,t01,,0\n",
        "alloc,t99999999999,7,0\n",
        "alloc,t7,8,0\n",
    );
    let t = parse(text).unwrap();
    assert_eq!(
        t.events(),
        &[
            alloc(0, 1, 0),
            alloc(1, 2, 0),
            alloc(2, 3, 0),
            alloc(3, 4, 0),
            alloc(4, 5, 0),
            alloc(5, 6, 0),
            Event::Free { id: 5 },
            Event::Free { id: 0 },
            Event::Free { id: 2 },
            Event::Free { id: 1 },
            alloc(5, 7, 0),
            alloc(0, 8, 0),
        ]
    );
    assert_eq!(t.ids(), 6);
}

/// One record of the reference reading: its first line and its fields, unescaped.
type RefRecord = (usize, Vec<String>);

/// RFC 4180 read character by character, the plain way: the reference the
/// fast reader is checked against. Errors are the line they name.
fn reference_records(text: &str) -> Result<Vec<RefRecord>, usize> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let chars: Vec<char> = text.chars().collect();
    let mut records = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        // A blank or comment line.
        let end = chars[i..]
            .iter()
            .position(|&c| c == '\n')
            .map_or(chars.len(), |p| i + p);
        let content: String = chars[i..end].iter().collect();
        if matches!(content.trim_ascii().chars().next(), None | Some('#')) {
            i = end + 1;
            line += 1;
            continue;
        }
        let first_line = line;
        let mut fields = Vec::new();
        loop {
            while matches!(chars.get(i), Some(' ' | '\t')) {
                i += 1;
            }
            if chars.get(i) == Some(&'"') {
                let open_line = line;
                let mut value = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err(open_line),
                        Some('"') if chars.get(i + 1) == Some(&'"') => {
                            value.push('"');
                            i += 2;
                        }
                        Some('"') => {
                            i += 1;
                            break;
                        }
                        Some(&c) => {
                            if c == '\n' {
                                line += 1;
                            }
                            value.push(c);
                            i += 1;
                        }
                    }
                }
                while matches!(chars.get(i), Some(' ' | '\t' | '\r')) {
                    i += 1;
                }
                if !matches!(chars.get(i), None | Some(',' | '\n')) {
                    return Err(line);
                }
                fields.push(value);
            } else {
                let mut value = String::new();
                while let Some(&c) = chars.get(i) {
                    match c {
                        ',' | '\n' => break,
                        '"' => return Err(line),
                        _ => value.push(c),
                    }
                    i += 1;
                }
                fields.push(value.trim_ascii().to_string());
            }
            if chars.get(i) == Some(&',') {
                i += 1;
            } else {
                break;
            }
        }
        i += 1;
        line += 1;
        records.push((first_line, fields));
    }
    Ok(records)
}

/// The contract's semantics over the reference records: the events, or the
/// line of the first error.
fn reference_trace(text: &str) -> Result<(Vec<Event>, u32), usize> {
    let records = reference_records(text)?;
    let mut rows = records.into_iter();
    let (header_line, header) = rows.next().ok_or(0usize)?;
    let names = ["action", "id", "size", "stream"];
    if header.len() != 4
        || !header
            .iter()
            .zip(names)
            .all(|(f, n)| f.eq_ignore_ascii_case(n))
    {
        return Err(header_line);
    }
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut live: Vec<bool> = Vec::new();
    let mut events = Vec::new();
    for (line, fields) in rows {
        if fields.len() > 4 {
            return Err(line);
        }
        let field = |n: usize| fields.get(n).map_or("", String::as_str);
        let stream = match field(3) {
            "" => 0,
            s => s.parse::<u64>().map_err(|_| line)?,
        };
        let mut id = |must_be_live: bool| -> Result<u32, usize> {
            if field(1).is_empty() {
                return Err(line);
            }
            let next = ids.len() as u32;
            let dense = *ids.entry(field(1).to_string()).or_insert(next);
            if dense as usize == live.len() {
                live.push(false);
            }
            if live[dense as usize] != must_be_live {
                return Err(line);
            }
            Ok(dense)
        };
        events.push(match field(0) {
            "alloc" => {
                let id = id(false)?;
                let size = field(2).parse::<u64>().map_err(|_| line)?;
                live[id as usize] = true;
                Event::Alloc { id, size, stream }
            }
            "free" => {
                let id = id(true)?;
                live[id as usize] = false;
                Event::Free { id }
            }
            "record_stream" => Event::RecordStream {
                id: id(true)?,
                stream,
            },
            "empty_cache" => Event::EmptyCache,
            "synchronize" => Event::SynchronizeStream { stream },
            _ => return Err(line),
        });
    }
    Ok((events, live.len() as u32))
}

/// Ids of every kind the reader treats apart: numbered with the common
/// prefix, bare numbers, leading zeros, numbers past the table, names, and
/// names that need quoting.
const IDS: [&str; 13] = [
    "t1",
    "t2",
    "t10",
    "t01",
    "3",
    "t123456789012",
    "x",
    "two words",
    "a,b",
    "say \"hi\"",
    "two\nlines",
    "t",
    "é1",
];

/// One generated row: what it does and how it is written.
#[derive(Debug, Clone)]
struct Row {
    kind: u8,
    id: usize,
    size: u64,
    stream: u8,
    style: u16,
}

fn row() -> impl Strategy<Value = Row> {
    (
        0u8..20,
        0..IDS.len(),
        0u64..5_000_000_000,
        0u8..3,
        any::<u16>(),
    )
        .prop_map(|(kind, id, size, stream, style)| Row {
            kind,
            id,
            size,
            stream,
            style,
        })
}

/// Writes `field` as the style bits say: quoted (always when it must be),
/// padded with spaces.
fn field(out: &mut String, value: &str, quote: bool, pad: bool) {
    if pad {
        out.push(' ');
    }
    if quote || value.contains([',', '"', '\n']) || value.starts_with(' ') {
        out.push('"');
        out.push_str(&value.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(value);
    }
    if pad {
        out.push(' ');
    }
}

/// A trace CSV from `rows`: mostly valid (allocs of free ids, frees of live
/// ones), with comments, blank lines, CRLF, quoting, padding, a BOM, and now
/// and then a row that is wrong.
fn render(rows: &[Row], bom: bool, quoted_header: bool) -> String {
    let mut out = String::new();
    if bom {
        out.push('\u{feff}');
    }
    out.push_str(if quoted_header {
        "\"action\",\"id\",\"size\",\"stream\"\n"
    } else {
        "action,id,size,stream\n"
    });
    let mut live = [false; IDS.len()];
    for r in rows {
        let s = r.style;
        let quote = s & 0b11 == 0;
        let pad = s & 0b1100 == 0;
        let eol = if s & 0x10 != 0 { "\r\n" } else { "\n" };
        if s & 0x7e0 == 0 {
            out.push_str("# a comment, \"with quotes\"\n");
        }
        if s & 0xf800 == 0 {
            out.push_str("\n  \n");
        }
        // Pick an id that makes the row valid, unless the row is meant to fail.
        let wrong = r.kind == 19;
        let want_live = matches!(r.kind, 8..=13 | 17);
        let id = (0..IDS.len())
            .map(|k| (r.id + k) % IDS.len())
            .find(|&k| live[k] == want_live || wrong)
            .unwrap_or(r.id);
        let (action, size, stream) = match r.kind {
            0..=7 if !live[id] => ("alloc", r.size.to_string(), r.stream.to_string()),
            8..=13 if live[id] => ("free", String::new(), r.stream.to_string()),
            14 => ("empty_cache", String::new(), String::new()),
            15 => ("synchronize", String::new(), r.stream.to_string()),
            16 if !live[id] => ("alloc", "12x".to_string(), "0".to_string()),
            17 if live[id] => ("record_stream", String::new(), r.stream.to_string()),
            18 => ("alloc", r.size.to_string(), "-1".to_string()),
            19 => ("free", String::new(), String::new()),
            _ => ("empty_cache", String::new(), String::new()),
        };
        match action {
            "alloc" if size.parse::<u64>().is_ok() && !stream.starts_with('-') => live[id] = true,
            "free" if live[id] => live[id] = false,
            _ => {}
        }
        let id = if matches!(action, "empty_cache" | "synchronize") {
            ""
        } else {
            IDS[id]
        };
        field(&mut out, action, quote && s & 0x100 != 0, pad);
        out.push(',');
        field(&mut out, id, quote, pad && s & 0x200 != 0);
        out.push(',');
        field(&mut out, &size, quote && s & 0x400 != 0, false);
        if s & 0x8000 == 0 || !stream.is_empty() {
            out.push(',');
            field(&mut out, &stream, false, pad && s & 0x800 != 0);
        }
        out.push_str(eol);
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The fast reader (canonical rows, record reader, quoted path) and the
    /// reference reading give the same trace, or fail on the same line.
    #[test]
    fn fast_reader_matches_the_reference(rows in prop::collection::vec(row(), 0..60), bom: bool, quoted_header: bool) {
        let text = render(&rows, bom, quoted_header);
        let fast = parse(&text);
        match reference_trace(&text) {
            Ok((events, ids)) => {
                let t = fast.map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
                prop_assert_eq!(t.events(), &events[..], "{}", text);
                prop_assert_eq!(t.ids(), ids);
            }
            Err(line) => {
                let message = fast.err().unwrap_or_default();
                prop_assert!(
                    message.starts_with(&format!("t.csv:{line}:")),
                    "reference fails on line {} but the reader says {:?}\n{}", line, message, text
                );
            }
        }
    }

    /// Arbitrary bytes after the header never panic the reader.
    #[test]
    fn arbitrary_bytes_never_panic(body in prop::collection::vec(any::<u8>(), 0..300)) {
        let mut data = b"action,id,size,stream\n".to_vec();
        data.extend_from_slice(&body);
        let _ = Trace::parse("t.csv", &data);
    }
}

/// Every command that replays reads a quoted, BOM-prefixed trace CSV as the
/// plain one: `replay`, `validate` and `recommend` give the same figures.
#[test]
fn commands_read_a_quoted_trace_as_the_plain_one() {
    let plain = "action,id,size,stream\nalloc,a,62914560,0\nalloc,b,4194304,0\nfree,a,,0\nalloc,c,41943040,0\n";
    let quoted = "\u{feff}\"action\",\"id\",\"size\",\"stream\"\r\nalloc,\"a\",\"62914560\",0\r\nalloc,b,4194304,0\r\nfree,\"a\",,0\r\nalloc,\"c\",41943040,0\r\n";
    let dir = tempfile::tempdir().expect("a temporary directory");
    let run = |text: &str, args: &[&str]| {
        let path = dir.path().join("t.csv");
        std::fs::write(&path, text).expect("written");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_allocdoc"))
            .args(args)
            .arg(&path)
            .args(["--capacity", "100MiB", "--format", "json"])
            .output()
            .expect("allocdoc runs");
        let stdout = String::from_utf8_lossy(&out.stdout).replace(dir.path().to_str().unwrap(), "");
        (out.status.code(), stdout)
    };
    for args in [
        &["replay"][..],
        &["validate", "--conf", "expandable_segments:True"],
        &["recommend"],
    ] {
        let (code, json) = run(plain, args);
        assert!(json.contains("peak_reserved_bytes"), "{args:?}: {json}");
        assert_eq!(run(quoted, args), (code, json), "{args:?}");
    }
}
