//! Any bytes as a policy file: parse, validate, compile never panic; what validates compiles in
//! every mode, and the compiled table holds its invariants (`paceline_fuzz_checks::policy`).
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| paceline_fuzz_checks::policy(data));
