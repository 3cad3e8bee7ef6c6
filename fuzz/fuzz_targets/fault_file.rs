//! Fault files (`faults/*.toml`): any text either loads or is an error that names the
//! place.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Err(err) = snag::fault::file::parse("fuzz.toml", text) {
        assert!(err.to_string().contains("fuzz.toml"), "{err}");
    }
});
