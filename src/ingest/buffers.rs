//! Inputs the caller already holds in memory (the Python API's `bytes` and
//! `str`), opened by name like files.

use super::{Bytes, Opened};
use crate::Error;
use crate::limits::Limits;
use std::sync::Arc;

/// Inputs the caller already holds in memory, under the names they go by
/// (the Python API passes `bytes` and `str` this way). Every other input
/// name is a file, and `-` standard input.
#[derive(Debug, Clone, Default)]
pub struct Buffers(Vec<(String, Arc<[u8]>)>);

impl Buffers {
    pub fn add(&mut self, name: impl Into<String>, data: Vec<u8>) {
        self.0.push((name.into(), Arc::from(data)));
    }

    /// Opens input `name`: the buffer of that name, decoded as a file would
    /// be (compressed or UTF-16 content too), else the file or standard input.
    pub fn open(&self, name: &str, limits: &Limits) -> Result<Opened, Error> {
        match self.0.iter().find(|(n, _)| n == name) {
            Some((_, data)) => {
                let reader = std::io::Cursor::new(Arc::clone(data));
                super::open_stream(name, Box::new(reader), limits)
            }
            None => super::open(name, limits),
        }
    }

    /// The whole of input `name` ([`Buffers::open`]).
    pub fn read(&self, name: &str, limits: &Limits) -> Result<Bytes, Error> {
        self.open(name, limits)?.into_bytes()
    }
}
