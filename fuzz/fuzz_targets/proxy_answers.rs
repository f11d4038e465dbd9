//! The proxy's HTTP/1.1 client against hyper's: the input's first byte picks the request's
//! method (odd: HEAD, else GET), the rest is all the upstream sends before it closes the
//! connection.
//!
//! Held: the proxy's client reads the answer as hyper's client reads it (status, end-to-end
//! headers, body), or refuses it; it never reads an answer hyper refuses, and the length it
//! declares to the client is the length of the body it reads.
#![no_main]

use fleet_limiter::fuzzing::proxy_answer_differs;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&first, answer)) = input.split_first() else {
        return;
    };
    if let Some(why) = proxy_answer_differs(answer, first % 2 == 1) {
        panic!("{why}\ninput: {}", answer.escape_ascii());
    }
});
