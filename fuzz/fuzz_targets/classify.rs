//! Rules built from arbitrary parameters and a packet: the classifier against a plain
//! first-match reading of the rules (`paceline_fuzz_checks::classify`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| paceline_fuzz_checks::classify(data));
