//! The input layer on arbitrary bytes, as standard input would bring them:
//! gzip, xz, zstd, bzip2 and UTF-16 decoding (nested too), kind detection,
//! the chunked scanner and the whole-input parsers behind it. Never a panic,
//! and every error stays within the small limits set here.
#![no_main]

use allocdoc::Limits;
use allocdoc::evidence::{Evidence, TextClues};
use allocdoc::ingest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits {
        max_input_bytes: 32 << 20,
        max_objects: 1 << 22,
        max_blocks: 1 << 18,
        max_observations: 10_000,
    };
    let reader = Box::new(std::io::Cursor::new(data.to_vec()));
    let Ok(opened) = ingest::open_stream("fuzz", reader, &limits) else {
        return;
    };
    let mut ev = Evidence::default();
    let _ = ingest::read_opened("fuzz", opened, &limits, &mut TextClues::default(), &mut ev);
});
