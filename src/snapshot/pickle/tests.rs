//! Tests of the decoder as a whole: the one-step dict build against the
//! opcodes one by one, shared key shapes, the tight loop against the
//! checked dispatch.

use super::*;

/// A list of `n` trace-like dicts as torch pickles them (EMPTY_DICT,
/// MEMOIZE, MARK, keys memoized by the first, SETITEMS); `frame` puts an
/// empty-length FRAME before each SETITEMS, which the one-step build of
/// [`Decoder::shaped_dict`](super::decoder::Decoder::shaped_dict) does not
/// take, so every dict is built opcode by opcode.
fn trace_like(n: u32, frame: bool) -> Vec<u8> {
    let mut d = b"\x80\x04]\x94(".to_vec();
    for i in 0..n {
        d.extend_from_slice(b"}\x94(");
        let keys: [&[u8]; 4] = [b"action", b"addr", b"size", b"frames"];
        for (k, key) in keys.iter().enumerate() {
            if i == 0 {
                d.push(0x8c);
                d.push(key.len() as u8);
                d.extend_from_slice(key);
                d.push(0x94);
            } else {
                // The keys are memo entries 2, 4, 5 and 6 (entry 3 is "alloc").
                d.extend_from_slice(&[b'h', [2, 4, 5, 6][k]]);
            }
            match k {
                0 if i == 0 => d.extend_from_slice(b"\x8c\x05alloc\x94"),
                0 => d.extend_from_slice(b"h\x03"),
                1 => {
                    d.extend_from_slice(&[0x8a, 5]);
                    d.extend_from_slice(
                        &(0x70_0000_0000u64 + u64::from(i) * 512).to_le_bytes()[..5],
                    );
                }
                2 => {
                    d.push(b'J');
                    d.extend_from_slice(&(i as i32 * 1000 - 7).to_le_bytes());
                }
                _ => d.extend_from_slice(if i % 3 == 0 { b"N" } else { b"K\x07" }),
            }
        }
        if frame {
            d.push(0x95);
            d.extend_from_slice(&0u64.to_le_bytes());
        }
        d.push(b'u');
    }
    d.extend_from_slice(b"e.");
    d
}

#[test]
fn dicts_built_in_one_step_are_the_dicts_built_opcode_by_opcode() {
    let (fast, slow) = (trace_like(300, false), trace_like(300, true));
    let (a, b) = (decode(&fast).unwrap(), decode(&slow).unwrap());
    assert_eq!(a.to_json(a.root, 8), b.to_json(b.root, 8));
    assert_eq!((a.slots.len(), a.pool.len()), (b.slots.len(), b.pool.len()));
    assert_eq!(a.shapes.len(), 1);
    let d = a.items(a.root).unwrap()[299];
    assert_eq!(a.get(d, "size").and_then(|v| a.i64(v)), Some(298_993));
    // The values budget runs out at the same opcode either way.
    for max_values in [50, 400, 1234, 2000] {
        let limits = Limits {
            max_values,
            ..Limits::default()
        };
        let at = |d: &[u8]| decode_with(d, limits).err().map(|e| e.offset());
        let (fa, sa) = (at(&fast), at(&slow));
        assert!(fa.is_some(), "{max_values}");
        // The slow input has 9 more bytes per dict before each SETITEMS.
        let dicts_before =
            |d: &[u8], off: usize| d[..off].windows(3).filter(|w| w == b"}\x94(").count();
        assert_eq!(
            dicts_before(&fast, fa.unwrap()),
            dicts_before(&slow, sa.unwrap()),
            "{max_values}"
        );
    }
}

#[test]
fn dicts_share_shapes_and_stay_dicts_when_they_grow() {
    // [{a: 1, b: 2}, {a: 3, b: 4} then c: 5 set on it], keys memoized as torch does.
    let data = b"\x80\x04](}(\x8c\x01a\x94K\x01\x8c\x01b\x94K\x02u}(h\x00K\x03h\x01K\x04u\x8c\x01cK\x05se.";
    let p = decode(data).unwrap();
    let items = p.items(p.root).unwrap();
    assert_eq!(items.len(), 2);
    let (d0, d1) = (items[0], items[1]);
    assert_eq!(p.dict(d0).unwrap().shaped().map(|(k, _)| k.len()), Some(2));
    assert_eq!(
        p.shapes.len(),
        1,
        "both dicts were built with the one key shape"
    );
    let get = |d, k| p.get(d, k).and_then(|v| p.i64(v));
    assert_eq!(
        (get(d0, "a"), get(d0, "b"), get(d0, "c")),
        (Some(1), Some(2), None)
    );
    // The SETITEM after SETITEMS moved d1 out of its shape; all three keys remain.
    assert_eq!(
        (get(d1, "a"), get(d1, "b"), get(d1, "c")),
        (Some(3), Some(4), Some(5))
    );
    assert_eq!(p.dict(d1).unwrap().len(), 3);
    assert_eq!(p.dict(d1).unwrap().shaped(), None);
}

#[test]
fn the_tight_loop_and_the_checked_dispatch_agree() {
    // pickle.dumps([x, x[:]], 4) for x = ['k', -1, 2**40, -5, 7, -2**59, 2**60, 300]:
    // the second list's key comes from the memo, 2**60 must be boxed.
    let data = b"\x80\x04\x95i\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94(\x8c\x01k\x94J\xff\xff\xff\xff\x8a\x06\x00\x00\x00\x00\x00\x01J\xfb\xff\xff\xffK\x07\x8a\x08\x00\x00\x00\x00\x00\x00\x00\xf8\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x10M,\x01e]\x94(h\x02J\xff\xff\xff\xff\x8a\x06\x00\x00\x00\x00\x00\x01J\xfb\xff\xff\xffK\x07\x8a\x08\x00\x00\x00\x00\x00\x00\x00\xf8\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x10M,\x01ee.";
    let p = decode(data).unwrap();
    let lists = p.items(p.root).unwrap();
    let ints =
        |l: V| -> Vec<Option<i64>> { p.items(l).unwrap()[1..].iter().map(|&v| p.i64(v)).collect() };
    let want: Vec<Option<i64>> = [-1, 1 << 40, -5, 7, -(1 << 59), 1 << 60, 300]
        .into_iter()
        .map(Some)
        .collect();
    assert_eq!(ints(lists[0]), want);
    assert_eq!(ints(lists[1]), want);
    assert_eq!(p.str(p.items(lists[1]).unwrap()[0]), Some("k"));
    // Within 10 bytes of the end the same opcodes take the checked path.
    let p = decode(b"\x80\x04]\x94(K\x01\x8a\x01\xffJ\xfe\xff\xff\xffh\x00e.").unwrap();
    let items = p.items(p.root).unwrap();
    assert_eq!(
        items[..3].iter().map(|&v| p.i64(v)).collect::<Vec<_>>(),
        [Some(1), Some(-1), Some(-2)]
    );
    assert_eq!(items[3], p.root, "the list holds itself");
    // A memo miss stops the loop and is reported at its opcode.
    let e = decode(b"\x80\x04]\x94(h\x07K\x01K\x02K\x03K\x04e.").unwrap_err();
    assert_eq!(e.offset(), 5, "{e}");
    assert!(e.to_string().contains("memo key 7"), "{e}");
}

#[test]
fn a_list_appended_between_other_objects_keeps_its_order() {
    // l = []; APPENDS [1, 2]; then a dict is built; APPENDS [3] to l.
    let data = b"\x80\x04]\x94(K\x01K\x02e}(\x8c\x01k\x94K\x09u0h\x00(K\x03e.";
    let p = decode(data).unwrap();
    let items: Vec<i64> = p
        .items(p.root)
        .unwrap()
        .iter()
        .filter_map(|&v| p.i64(v))
        .collect();
    assert_eq!(items, vec![1, 2, 3]);
}

/// Decoding with the pages populated on a thread of their own
/// (`grow::populating`, as snapshots of 32 MiB or more are) gives the
/// decode without it: 200 000 dicts, a value pool of several MiB, asked
/// for ahead of the writes chunk after chunk; and the decoder did ask: the
/// pool's pages are resident at least a chunk (2 MiB) past its last value.
#[test]
fn decoding_beside_a_populating_thread_is_the_plain_decode() {
    let data = trace_like(200_000, false);
    let plain = decode(&data).unwrap();
    let helped = crate::snapshot::grow::populating(true, || decode(&data).unwrap());
    assert!(
        plain.pool.len() * 8 > 4 << 20,
        "{} values",
        plain.pool.len()
    );
    assert_eq!(
        (plain.slots.len(), plain.pool.len()),
        (helped.slots.len(), helped.pool.len())
    );
    assert_eq!(plain.to_json(plain.root, 8), helped.to_json(helped.root, 8));
    #[cfg(target_os = "linux")]
    {
        let value = size_of::<V>();
        let end = helped.pool.as_ptr() as usize + helped.pool.len() * value;
        let ahead = (2 << 20) - 4096;
        assert!((helped.pool.capacity() - helped.pool.len()) * value > 2 << 20);
        let pages = crate::snapshot::grow::tests::resident(end, ahead);
        assert!(
            pages * 4096 >= ahead,
            "{pages} pages resident past the pool's end"
        );
    }
}

/// A [`Tap`] that takes (or only counts) every shaped dict.
#[derive(Default)]
struct Taking {
    take: bool,
    told: Vec<(u32, usize)>,
}

impl Tap<'_> for Taking {
    fn dict(&mut self, _: &Pickle<'_>, dict: V, _: u32, values: &[V]) -> bool {
        self.told
            .push((dict.id().unwrap_or(u32::MAX), values.len()));
        self.take
    }
}

fn tapped<'a>(data: &'a [u8], tap: &mut Taking) -> Pickle<'a> {
    decode_tapped(data, Limits::default(), None, Some(tap)).unwrap()
}

/// Each dict is told to the tap once, by the one-step build and the
/// opcodes one by one alike; the ones it takes lose their values (the pool
/// does not grow) and read as nothing, and reading one marks the pickle.
#[test]
fn a_tap_is_told_each_shaped_dict_once_and_what_it_takes_is_gone() {
    for frame in [false, true] {
        let data = trace_like(50, frame);
        let plain = decode(&data).unwrap();
        let mut counting = Taking::default();
        let counted = tapped(&data, &mut counting);
        assert_eq!(counting.told.len(), 50);
        assert!(counting.told.iter().all(|&(_, n)| n == 4));
        assert_eq!(counted.pool, plain.pool);
        let mut taking = Taking {
            take: true,
            ..Taking::default()
        };
        let taken = tapped(&data, &mut taking);
        assert_eq!(taking.told, counting.told);
        assert!(taken.pool.len() + 50 * 4 <= plain.pool.len());
        assert!(!taken.consumed_read());
        let items = taken.items(taken.root).unwrap().to_vec();
        assert_eq!(items.len(), 50);
        assert!(taken.dict(items[7]).is_none());
        assert!(taken.consumed_read());
    }
}

/// A dict given more items after a tap took it marks the pickle; a dict
/// built item by item (SETITEM, protocol 0) is not told.
#[test]
fn a_dict_changed_after_it_was_taken_marks_the_pickle() {
    // [d] with d = {"a": 1}, then (after another object is built) d["b"] = 2.
    let data = b"\x80\x04]\x94(}\x94(\x8c\x01a\x94K\x01u\x8c\x01x\x940\x8c\x01b\x94K\x02se.";
    let mut counting = Taking::default();
    let p = tapped(data, &mut counting);
    assert_eq!(counting.told.len(), 1);
    let d = p.items(p.root).unwrap()[0];
    assert_eq!(p.dict(d).unwrap().len(), 2);
    assert!(!p.consumed_read());
    let mut taking = Taking {
        take: true,
        ..Taking::default()
    };
    let p = tapped(data, &mut taking);
    assert!(p.consumed_read());
    // {"a": 1} by EMPTY_DICT, SETITEM.
    let mut counting = Taking::default();
    tapped(b"\x80\x04}\x94\x8c\x01a\x94K\x01s.", &mut counting);
    assert!(counting.told.is_empty());
}
