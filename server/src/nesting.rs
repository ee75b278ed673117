//! How deep arrays and objects nest in JSON text the server keeps as text (an item's
//! `messages` and `extra_info`), which serde_json skips over without its own limit.

/// The deepest nesting of arrays and objects `messages` and `extra_info` may have: the
/// limit the rest of a request has (serde_json's). They are kept as text, which serde_json
/// skips over without one, and a chat 200,000 levels deep, stored and answered, made every
/// reader's JSON parser give up (Python's `json` at about a thousand).
pub(crate) const MAX_NESTING: usize = 128;

/// How deep arrays and objects nest in the JSON text `text` (well-formed: serde_json or
/// the Arrow decoder checked it). A string's contents, most of a chat's bytes, are skipped
/// with `memchr` to its closing quote: a byte at a time, this scan was a sixth of the
/// server's time under Arrow batch writes.
pub(crate) fn nesting(text: &str) -> usize {
    let bytes = text.as_bytes();
    let (mut depth, mut deepest, mut at) = (0usize, 0usize, 0usize);
    while let Some(&b) = bytes.get(at) {
        at += 1;
        match b {
            b'"' => at = string_end(bytes, at),
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Where the JSON string whose contents start at `at` ends: just past its closing quote
/// (the text's end when there is none).
fn string_end(bytes: &[u8], mut at: usize) -> usize {
    loop {
        let Some(rest) = bytes.get(at..) else {
            return bytes.len();
        };
        match memchr::memchr2(b'"', b'\\', rest) {
            None => return bytes.len(),
            // An escape: the byte after the backslash is never the closing quote.
            Some(i) if rest[i] == b'\\' => at += i + 2,
            Some(i) => return at + i + 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::nesting;

    #[test]
    fn nesting_counts_arrays_and_objects_but_not_brackets_in_strings() {
        assert_eq!(nesting("[]"), 1);
        assert_eq!(
            nesting(r#"[{"role": "user", "content": [{"type": "text"}]}]"#),
            4
        );
        assert_eq!(nesting(r#"["[[[{{{", "\"[[", {"k": "]]]"}]"#), 2);
        assert_eq!(nesting("1"), 0);
        // An escaped backslash ends in the closing quote; an escaped quote does not.
        assert_eq!(nesting(r#"["\\", [1]]"#), 2);
        assert_eq!(nesting(r#"["\\\"[", [[1]]]"#), 3);
        assert_eq!(nesting(r#"["open [[["#), 1);
        let deep = format!("{}{}", "[".repeat(129), "]".repeat(129));
        assert_eq!(nesting(&deep), 129);
    }
}
