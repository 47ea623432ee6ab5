//! Any bytes as a frame through the parser the tc program runs (`paceline_fuzz_checks::packet`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| paceline_fuzz_checks::packet(data));
