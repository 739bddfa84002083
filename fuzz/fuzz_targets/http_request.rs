//! The control API's HTTP request parser on arbitrary bytes: never panics, consumes no more
//! than it was given, and parses the consumed prefix alone to the same request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_http::parse;

fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(Some((req, n))) => {
            assert!(n <= data.len());
            let (again, m) = parse(&data[..n]).expect("prefix parses").expect("prefix is complete");
            assert_eq!((again, m), (req, n));
        }
        Ok(None) => assert!(data.len() <= vectorlb_http::MAX_HEAD + vectorlb_http::MAX_BODY + 4),
        Err(e) => assert!((400..600).contains(&e.status)),
    }
});
