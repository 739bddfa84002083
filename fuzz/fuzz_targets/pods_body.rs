//! The pods API's request body (`POST /v1/pods`, what the CNI plugin sends): arbitrary bytes
//! either parse or give a 400 with a message; what parses is checked (`NewPod::addresses`)
//! without panicking, and serialises back to a body that parses the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vectorlb_api::error::{parse_body, ApiError};
use vectorlb_api::model::NewPod;

fuzz_target!(|data: &[u8]| {
    match parse_body::<NewPod>(data) {
        Ok(p) => {
            match p.addresses() {
                Ok(ips) => assert_eq!(ips.len(), p.ips.len()),
                Err(m) => assert!(!m.is_empty()),
            }
            let again: NewPod = parse_body(&serde_json::to_vec(&p).expect("serialises")).expect("round trip");
            assert_eq!(serde_json::to_value(&again).unwrap(), serde_json::to_value(&p).unwrap());
        }
        Err(ApiError::BadRequest(m)) => assert!(!m.is_empty()),
        Err(e) => panic!("a body error must be a 400: {e:?}"),
    }
});
