//! Where byte strings lie in this store: every column family, keys and
//! values as RocksDB hands them back (decompressed), counted per family.
//! What a residency audit asks of a cell that must hold nothing of a
//! tenant.

use super::keys::cf;
use super::{Result, Store};

impl Store {
    /// Per column family, the rows whose key or value contains any of
    /// `needles` (families with none left out). Reads the whole store once.
    pub fn rows_containing(&self, needles: &[Vec<u8>]) -> Result<Vec<(&'static str, u64)>> {
        let mut found = Vec::new();
        for name in cf::ALL {
            let mut it = self.db.raw_iterator_cf(self.cf(name));
            it.seek_to_first();
            let mut rows = 0;
            while let (Some(key), Some(value)) = (it.key(), it.value()) {
                if (needles.iter()).any(|n| contains(key, n) || contains(value, n)) {
                    rows += 1;
                }
                it.next();
            }
            it.status()?;
            if rows > 0 {
                found.push((name, rows));
            }
        }
        Ok(found)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::contains;

    #[test]
    fn finds_a_needle_anywhere_and_never_an_empty_one() {
        assert!(contains(b"xxd42-1-yy", b"d42-1-"));
        assert!(contains(b"d42-1-", b"d42-1-"));
        assert!(!contains(b"d42-2-", b"d42-1-"));
        assert!(!contains(b"abc", b""));
    }
}
