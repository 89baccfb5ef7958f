//! The JSON view of a value, for small recorded dicts
//! (`allocator_settings`): iterative, and within a budget of bytes.

use super::{Kind, Obj, Pickle, V, Value};

impl Pickle<'_> {
    /// The value as JSON, for small recorded dicts (`allocator_settings`).
    /// Containers nested deeper than `max_depth` become `null`; iterative.
    /// Shared objects are written out at each use, so a file could make the
    /// tree exponentially larger than itself: past [`JSON_BUDGET`] bytes,
    /// values become `null` and keys `"…"`.
    pub fn to_json(&self, v: V, max_depth: usize) -> serde_json::Value {
        use serde_json::Value as J;
        let mut frames: Vec<JsonFrame> = Vec::new();
        let mut result = J::Null;
        let mut next = Some(v);
        let mut left = JSON_BUDGET;
        // Takes an item's rough size from the budget; false once spent.
        let mut spend = |v: V| {
            let text = match self.obj(v) {
                Some(Obj::Str(s)) => s.len(),
                Some(Obj::Bytes(b)) => b.len(),
                _ => 0,
            };
            let cost = text.saturating_add(16);
            let fits = cost <= left;
            if fits {
                left -= cost;
            }
            fits
        };
        loop {
            if let Some(v) = next.take() {
                let leaf = match (self.value(v), self.obj(v)) {
                    _ if !spend(v) => Some(J::Null),
                    (Value::None, _) => Some(J::Null),
                    (Value::Bool(b), _) => Some(J::Bool(b)),
                    (Value::Int(i), _) => Some(J::from(i)),
                    (Value::UInt(u), _) => Some(J::from(u)),
                    (Value::Float(f), _) => {
                        Some(serde_json::Number::from_f64(f).map_or(J::Null, J::Number))
                    }
                    (_, Some(Obj::Str(s))) => Some(J::String(s.to_string())),
                    (_, Some(Obj::Bytes(b))) => Some(J::String(String::from_utf8_lossy(b).into())),
                    (_, Some(Obj::Container(c))) if frames.len() < max_depth => {
                        let dict = c.kind == Kind::Dict;
                        let items: Vec<V> = match self.dict_of(&c) {
                            Some(pairs) => pairs.iter().flat_map(|(k, v)| [k, v]).collect(),
                            None => self.items_of(&c).to_vec(),
                        };
                        frames.push(JsonFrame {
                            out: if dict {
                                J::Object(serde_json::Map::new())
                            } else {
                                J::Array(Vec::new())
                            },
                            dict,
                            key: None,
                            items: items.into_iter(),
                        });
                        None
                    }
                    _ => Some(J::Null),
                };
                if let Some(j) = leaf {
                    place(&mut frames, &mut result, j);
                }
            }
            // Hand out the innermost container's next child, or close it.
            let Some(top) = frames.last_mut() else { break };
            match top.items.next() {
                Some(child) if top.dict && top.key.is_none() => {
                    top.key = Some(if spend(child) {
                        self.key_text(child)
                    } else {
                        "…".into()
                    });
                    // The value follows.
                    next = top.items.next();
                    if next.is_none() {
                        top.key = None;
                    }
                }
                Some(child) => next = Some(child),
                None => {
                    if let Some(done) = frames.pop() {
                        place(&mut frames, &mut result, done.out);
                    }
                }
            }
        }
        result
    }

    /// A dict key as text (torch stringifies keys; ints are written in decimal).
    fn key_text(&self, k: V) -> String {
        match self.value(k) {
            Value::Int(i) => i.to_string(),
            Value::UInt(u) => u.to_string(),
            Value::Bool(b) => if b { "True" } else { "False" }.into(),
            Value::None => "None".into(),
            Value::Float(f) => f.to_string(),
            Value::Ref(_) => self.str(k).unwrap_or("?").to_string(),
        }
    }
}

/// Bytes of text (and 16 per value) [`Pickle::to_json`] writes at most:
/// recorded settings take a few hundred.
const JSON_BUDGET: usize = 1 << 20;

/// A JSON container being filled: whether it is a dict, the key waiting for
/// its value, and the items still to visit.
struct JsonFrame {
    out: serde_json::Value,
    dict: bool,
    key: Option<String>,
    items: std::vec::IntoIter<V>,
}

/// Puts a finished JSON value into the innermost open container (under its
/// pending key for a dict), or makes it the result.
fn place(frames: &mut [JsonFrame], result: &mut serde_json::Value, val: serde_json::Value) {
    match frames.last_mut() {
        Some(f) => match &mut f.out {
            serde_json::Value::Object(m) => {
                m.insert(f.key.take().unwrap_or_default(), val);
            }
            serde_json::Value::Array(a) => a.push(val),
            _ => {}
        },
        None => *result = val,
    }
}
