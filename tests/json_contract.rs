//! Every command's JSON output against the contract in docs/json.md: each table
//! there (after a `<!-- schema: NAME -->` marker) lists the fields of one
//! document or shared object with their types and presence. A field the
//! output has and the table does not, a value of another type, or a missing
//! *always* field fails.

use serde_json::Value;
use std::collections::BTreeMap;

const DOC: &str = include_str!("../docs/json.md");

#[derive(Debug, Clone, PartialEq)]
enum Ty {
    String,
    Integer,
    Number,
    Boolean,
    Null,
    Object,
    Array,
    Any,
    /// An object laid out as another table.
    Ref(String),
}

/// The fields below one path of a table: named ones, `*` (any key), `[]` (items).
#[derive(Debug, Default)]
struct Node {
    types: Vec<Ty>,
    always: bool,
    fields: BTreeMap<String, Node>,
    star: Option<Box<Node>>,
    item: Option<Box<Node>>,
}

impl Node {
    fn at(&mut self, path: &str) -> &mut Node {
        let mut node = self;
        for seg in path.split('.') {
            let (key, items) = match seg.find("[]") {
                Some(i) => (&seg[..i], seg[i..].len() / 2),
                None => (seg, 0),
            };
            if !key.is_empty() {
                node = match key {
                    "*" => node.star.get_or_insert_with(Box::default),
                    k => node.fields.entry(k.to_owned()).or_default(),
                };
            }
            for _ in 0..items {
                node = node.item.get_or_insert_with(Box::default);
            }
        }
        node
    }
}

fn parse_type(t: &str) -> Vec<Ty> {
    t.split('|')
        .map(|t| match t.trim() {
            "string" => Ty::String,
            "integer" => Ty::Integer,
            "number" => Ty::Number,
            "boolean" => Ty::Boolean,
            "null" => Ty::Null,
            "object" => Ty::Object,
            "array" => Ty::Array,
            "any" => Ty::Any,
            r if r.starts_with('@') => Ty::Ref(r[1..].to_owned()),
            other => panic!("docs/json.md: unknown type {other:?}"),
        })
        .collect()
}

/// Every `<!-- schema: NAME -->` table of docs/json.md.
fn schemas() -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    let mut current: Option<(String, Node)> = None;
    for line in DOC.lines() {
        if let Some(name) = line
            .strip_prefix("<!-- schema: ")
            .and_then(|l| l.strip_suffix(" -->"))
        {
            if let Some((n, node)) = current.take() {
                out.insert(n, node);
            }
            current = Some((name.to_owned(), Node::default()));
            continue;
        }
        let Some((_, root)) = current.as_mut() else {
            continue;
        };
        let cells: Vec<&str> = line.split(" | ").collect();
        if !line.starts_with("| `") || cells.len() < 4 {
            continue;
        }
        let path = cells[0].trim_start_matches("| ").trim_matches('`');
        let node = root.at(path);
        node.types = parse_type(&cells[1].replace("\\|", "|"));
        node.always = match cells[2] {
            "always" => true,
            "optional" => false,
            p => panic!("docs/json.md: {path}: presence {p:?}"),
        };
    }
    if let Some((n, node)) = current {
        out.insert(n, node);
    }
    out
}

fn type_of(v: &Value) -> Ty {
    match v {
        Value::Null => Ty::Null,
        Value::Bool(_) => Ty::Boolean,
        Value::Number(n) if n.is_i64() || n.is_u64() => Ty::Integer,
        Value::Number(_) => Ty::Number,
        Value::String(_) => Ty::String,
        Value::Array(_) => Ty::Array,
        Value::Object(_) => Ty::Object,
    }
}

/// The tables of docs/json.md and what failed against them so far.
struct Checker {
    schemas: BTreeMap<String, Node>,
    errors: Vec<String>,
}

impl Checker {
    fn new() -> Self {
        Checker {
            schemas: schemas(),
            errors: Vec::new(),
        }
    }

    /// Checks `v` as a document laid out as table `table`.
    fn document(&mut self, v: &Value, table: &str, at: &str) {
        let root = Node {
            types: vec![Ty::Ref(table.to_owned())],
            ..Node::default()
        };
        check(&self.schemas, &mut self.errors, v, &root, at);
    }
}

fn table<'a>(schemas: &'a BTreeMap<String, Node>, name: &str) -> &'a Node {
    schemas
        .get(name)
        .unwrap_or_else(|| panic!("docs/json.md has no table {name}"))
}

/// Checks `v` against `node` (and the tables its type refers to).
fn check(
    schemas: &BTreeMap<String, Node>,
    errors: &mut Vec<String>,
    v: &Value,
    node: &Node,
    at: &str,
) {
    let t = type_of(v);
    // A path with rows below it but none of its own (`a[]` of `a[].b`) is an object.
    let types = if node.types.is_empty() {
        &[Ty::Object][..]
    } else {
        &node.types[..]
    };
    let fits = types.iter().any(|d| match d {
        Ty::Any => true,
        Ty::Number => matches!(t, Ty::Number | Ty::Integer),
        Ty::Ref(_) => t == Ty::Object,
        d => *d == t,
    });
    if !fits {
        errors.push(format!("{at}: a {t:?}, documented as {types:?}"));
        return;
    }
    if types.contains(&Ty::Any) {
        return;
    }
    match v {
        Value::Object(map) => {
            // The node's own fields, then those of the tables it refers to.
            let tables: Vec<&Node> = std::iter::once(node)
                .chain(types.iter().filter_map(|t| match t {
                    Ty::Ref(r) => Some(table(schemas, r)),
                    _ => None,
                }))
                .collect();
            for (k, child) in map {
                let found = tables
                    .iter()
                    .find_map(|n| n.fields.get(k))
                    .or_else(|| tables.iter().find_map(|n| n.star.as_deref()));
                match found {
                    Some(n) => check(schemas, errors, child, n, &format!("{at}.{k}")),
                    None => errors.push(format!("{at}.{k}: not in docs/json.md")),
                }
            }
            for n in &tables {
                for (k, f) in &n.fields {
                    if f.always && !map.contains_key(k) {
                        errors.push(format!("{at}.{k}: always present, missing"));
                    }
                }
            }
        }
        Value::Array(items) => match &node.item {
            Some(item) => {
                for (i, x) in items.iter().enumerate() {
                    check(schemas, errors, x, item, &format!("{at}[{i}]"));
                }
            }
            None if items.is_empty() => {}
            None => errors.push(format!("{at}[]: items not in docs/json.md")),
        },
        _ => {}
    }
}

/// (exit code, standard output) of `allocdoc ARGS`; the output must be UTF-8.
fn allocdoc(args: &[&str]) -> (i32, String) {
    let out = crate::cli::output(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).expect("UTF-8 output"),
    )
}

/// Runs `args` and checks its JSON document against table `table`.
fn check_command(c: &mut Checker, table: &str, args: &[&str]) {
    let (code, out) = allocdoc(args);
    // 1: an OOM or an invalid value; 2 with --each: an input failed; 4: a
    // verdict on uncertain evidence; 5: nothing to replay (the rules' answer).
    assert!(
        matches!(code, 0..=2 | 4 | 5) && !out.is_empty(),
        "{args:?} exited {code}: no document to check"
    );
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    c.document(&v, table, &format!("{args:?}"));
    assert_eq!(v["schema_version"], 1, "{args:?}: schema_version");
}

/// `--each --format jsonl`: lines that failed against `each-line`, the others
/// (less `input`) against the command's own table.
fn check_each(c: &mut Checker, table: &str, args: &[&str]) -> usize {
    let (code, out) = allocdoc(args);
    assert!(matches!(code, 0 | 2), "{args:?} exited {code}");
    let mut lines = 0;
    for line in out.lines() {
        let mut v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}"));
        let name = v["input"].as_str().unwrap_or_default().to_owned();
        let against = if v.get("error").is_some() {
            "each-line"
        } else {
            if let Some(map) = v.as_object_mut() {
                map.remove("input");
            }
            table
        };
        c.document(&v, against, &name);
        lines += 1;
    }
    lines
}

#[test]
fn every_command_output_follows_docs_json_md() {
    let mut c = Checker::new();
    // Breadth: every fixture, one incident each.
    for table in ["parse", "diagnose"] {
        let n = check_each(
            &mut c,
            table,
            &[
                table,
                "--each",
                "--format",
                "jsonl",
                "fixtures",
                "no-such-file.log",
            ],
        );
        assert!(n > 150, "{table} --each covered {n} inputs");
    }
    let commands: &[(&str, &[&str])] = &[
        (
            "each",
            &[
                "diagnose",
                "--each",
                "--format",
                "json",
                "fixtures/text",
                "no-such-file.log",
            ],
        ),
        (
            "diagnose",
            &[
                "diagnose",
                "--format",
                "json",
                "-v",
                "fixtures/text/readme_example.log",
            ],
        ),
        (
            "diagnose",
            &[
                "diagnose",
                "--format",
                "json",
                "fixtures/eval/comfy-org-comfyui-9529.txt",
                "fixtures/text/readme_example.log",
                "fixtures/text/constructed_stats_pprint_rank.log",
            ],
        ),
        (
            // Windows: every shell's line; the config in effect in `setup.current`.
            "diagnose",
            &[
                "diagnose",
                "--format",
                "json",
                "--platform",
                "windows",
                "--conf",
                "garbage_collection_threshold:0.6",
                "fixtures/text/readme_example.log",
            ],
        ),
        (
            "conf",
            &[
                "conf",
                "check",
                "--format",
                "json",
                "max_split_size_mb:20",
                "--torch-version",
                "2.4",
            ],
        ),
        (
            // A setting accepted but ignored on the platform (`ignored`).
            "conf",
            &[
                "conf",
                "check",
                "--format",
                "json",
                "expandable_segments:True",
                "--platform",
                "windows",
            ],
        ),
        (
            "conf",
            &[
                "conf",
                "check",
                "--format",
                "json",
                "backend:cudaMallocAsync,max_split_size_mb:128,roundup_power2_divisions:[256:1,>:8]",
                "--torch-version",
                "2.10",
            ],
        ),
        (
            "conf",
            &[
                "conf",
                "check",
                "--format",
                "json",
                "garbage_collection_threshold:0.6,expandable_segments:True,release_lock_on_cudamalloc:True",
            ],
        ),
        (
            "replay",
            &[
                "replay",
                "--format",
                "json",
                "fixtures/validate/interleaved_16mib.csv",
                "--conf",
                "",
                "--conf",
                "expandable_segments:True",
                "--capacity",
                "80MiB",
                "--summary",
            ],
        ),
        (
            "replay",
            &[
                "replay",
                "--format",
                "json",
                "fixtures/snapshots/maphsge4-select_n_snapshot_traced.pickle",
                "--fidelity",
            ],
        ),
        (
            "recommend",
            &[
                "recommend",
                "--format",
                "json",
                "fixtures/validate/interleaved_16mib.csv",
                "--capacity",
                "80MiB",
            ],
        ),
        (
            "recommend",
            &[
                "recommend",
                "--format",
                "json",
                "fixtures/validate/oom_fragmented_2.5.txt",
            ],
        ),
        (
            // Nothing to replay (no figures to fit a probe to): the rules' answer alone.
            "recommend-rules-only",
            &[
                "recommend",
                "--format",
                "json",
                "fixtures/text/constructed_cudnn.log",
            ],
        ),
        (
            "validate",
            &[
                "validate",
                "--format",
                "json",
                "fixtures/validate/oom_fragmented_2.5.txt",
                "--conf",
                "expandable_segments:True",
            ],
        ),
        (
            "validate",
            &[
                "validate",
                "--format",
                "json",
                "fixtures/validate/interleaved_16mib.csv",
                "--conf",
                "expandable_segments:True",
                "--capacity",
                "80MiB",
            ],
        ),
        (
            "top",
            &[
                "top",
                "--format",
                "json",
                "fixtures/snapshots/magma27-assignment2-systems_memory_snapshot.pickle",
            ],
        ),
        (
            "top",
            &[
                "top",
                "--format",
                "json",
                "--by",
                "stack",
                "--at",
                "1402",
                "fixtures/snapshots/magma27-assignment2-systems_memory_snapshot.pickle",
            ],
        ),
        (
            "top",
            &[
                "top",
                "--format",
                "json",
                "fixtures/snapshots/muduard-layoutediting_dump_snapshot.pickle",
            ],
        ),
        (
            "top",
            &[
                "top",
                "--format",
                "json",
                "fixtures/snapshots/gen-fills-capacity-oom.pickle",
            ],
        ),
        (
            // Rows and a growing site whose allocations mix categories.
            "top",
            &[
                "top",
                "--format",
                "json",
                "fixtures/snapshots/gen-growth-leak.pickle",
            ],
        ),
        (
            // Mixed rows, and memory live before one side's trace.
            "diff",
            &[
                "diff",
                "--format",
                "json",
                "fixtures/snapshots/gen-trace-frees-first.pickle",
                "fixtures/snapshots/gen-growth-leak.pickle",
            ],
        ),
        (
            "top-ranks",
            &[
                "top",
                "--format",
                "json",
                "fixtures/snapshots/wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot.pickle",
                "fixtures/snapshots/magma27-assignment2-systems_memory_snapshot.pickle",
            ],
        ),
        (
            "diff",
            &[
                "diff",
                "--format",
                "json",
                "-n",
                "3",
                "fixtures/snapshots/wedsonlin-assignment2-systems_medium_128_inference_memory_snapshot.pickle",
                "fixtures/snapshots/magma27-assignment2-systems_memory_snapshot.pickle",
            ],
        ),
        (
            "fit",
            &[
                "fit",
                "--format",
                "json",
                "fixtures/fit/attn-256.pickle.xz",
                "fixtures/fit/attn-1024.pickle.xz",
                "--sizes",
                "256,1024",
                "--at",
                "4096",
                "--conf",
                "expandable_segments:True",
                "--capacity",
                "3GiB",
            ],
        ),
        (
            "fit",
            &[
                "fit",
                "--format",
                "json",
                "fixtures/fit/forward2.7b-128.pickle.xz",
                "fixtures/fit/forward2.7b-512.pickle.xz",
                "fixtures/fit/forward2.7b-1024.pickle.xz",
                "--sizes",
                "128,512,1024",
                "--at",
                "2048",
            ],
        ),
        (
            "fit-grid",
            &[
                "fit",
                "--format",
                "json",
                "fixtures/grid/attn-d16_s256.pickle.xz",
                "fixtures/grid/attn-d32_s256.pickle.xz",
                "fixtures/grid/attn-d16_s1024.pickle.xz",
                "--points",
                "16,256;32,256;16,1024",
                "--knobs",
                "d_model,seq_len",
                "--at-points",
                "64,256;16,16384",
                "--conf",
                "expandable_segments:True",
                "--capacity",
                "16GiB",
                "--along",
                "d_model=16,64",
            ],
        ),
        (
            "forecast",
            &[
                "forecast",
                "--format",
                "json",
                "fixtures/forecast/xl-forward-128.pickle.xz",
                "fixtures/forecast/xl-forward-256.pickle.xz",
                "--sizes",
                "128,256",
                "--run",
                "fixtures/forecast/xl-forward-ramp.txt",
                "--capacity",
                "31579502018",
            ],
        ),
        (
            "forecast",
            &[
                "forecast",
                "--format",
                "json",
                "fixtures/fit/attn-256.pickle.xz",
                "fixtures/fit/attn-1024.pickle.xz",
                "--sizes",
                "256,1024",
                "--run",
                "fixtures/forecast/attn-ramp.txt",
                "--conf",
                "max_split_size_mb:64",
                "--capacity",
                "40GiB",
            ],
        ),
        (
            "forecast",
            &[
                "forecast",
                "--format",
                "json",
                "fixtures/grid/attn-d16_s256.pickle.xz",
                "fixtures/grid/attn-d32_s256.pickle.xz",
                "fixtures/grid/attn-d16_s1024.pickle.xz",
                "--points",
                "16,256;32,256;16,1024",
                "--knobs",
                "d_model,seq_len",
                "--lengths",
                "fixtures/forecast/lengths.txt",
                "--batch",
                "max",
                "--steps",
                "20",
                "--pad-to",
                "64",
                "--capacity",
                "1GiB",
            ],
        ),
        ("rules-list", &["rules", "list", "--format", "json"]),
        (
            "rules-show",
            &["rules", "show", "reserved-gap", "--format", "json"],
        ),
        ("rules-test", &["rules", "test", "--format", "json"]),
    ];
    for (table, args) in commands {
        check_command(&mut c, table, args);
    }
    assert!(c.errors.is_empty(), "{}", c.errors.join("\n"));
}

#[test]
fn the_checker_finds_what_is_undocumented_mistyped_or_missing() {
    let mut c = Checker::new();
    let v = serde_json::json!({"schema_version": 1, "results": [
        {"rule": "a", "case": "b", "passed": "yes", "failure": null, "extra": 1},
        {"rule": "a", "passed": true, "failure": null}
    ]});
    c.document(&v, "rules-test", "doc");
    let mut errors = c.errors.clone();
    errors.sort();
    assert_eq!(
        errors,
        [
            "doc.results[0].extra: not in docs/json.md",
            "doc.results[0].passed: a String, documented as [Boolean]",
            "doc.results[1].case: always present, missing",
        ]
    );
}
