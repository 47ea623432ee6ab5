//! Rules built from arbitrary parameters and a packet: the classifier against a plain
//! first-match reading of the rules (`paceline_fuzz::classify`).
#![no_main]
libfuzzer_sys::fuzz_target!(|input: paceline_fuzz::ClassifyInput| paceline_fuzz::classify(&input));
