//! The inline fault spec (`--fault latency:latency=100,jitter=10`): any text either
//! parses or is an error; a parsed fault shows its attributes without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(fault) = text.parse::<snag::fault::Fault>() {
        let _ = fault.kind.attributes_json();
        let _ = fault.applies(1, "p", 0);
    }
});
