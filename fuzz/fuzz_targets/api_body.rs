//! The control API's request bodies on arbitrary bytes (the HTTP layer itself is hyper's):
//! every body type either parses or gives a 400 whose message names where it went wrong;
//! nothing panics, and what parses serialises back to a body that parses to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_api::error::{parse_body, ApiError};
use vectorlb_api::model::{BackendPatch, HaChange, NewBackend, NewService, ServicePatch};

fn check<T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug>(data: &[u8]) {
    match parse_body::<T>(data) {
        Ok(v) => {
            let again: T = parse_body(&serde_json::to_vec(&v).expect("serialises")).expect("round trip");
            assert_eq!(again, v);
        }
        Err(ApiError::BadRequest(m)) => assert!(!m.is_empty()),
        Err(e) => panic!("a body error must be a 400: {e:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    check::<NewService>(data);
    check::<ServicePatch>(data);
    check::<NewBackend>(data);
    check::<BackendPatch>(data);
    let _ = parse_body::<HaChange>(data);
});
