//! Any bytes as a record's value: the parser answers an envelope or an error, never
//! panics; an envelope it accepts fits the inbox and PostgreSQL, and survives a round
//! trip through its own JSON.
#![no_main]

use libfuzzer_sys::fuzz_target;
use saga::Envelope;
use saga::envelope::MAX_TEXT_BYTES;

fuzz_target!(|data: &[u8]| {
    let Ok(event) = Envelope::from_slice(data) else {
        return;
    };
    for text in [&event.id, &event.event_type, &event.aggregate_id] {
        assert!(text.len() <= MAX_TEXT_BYTES);
        assert!(!text.contains('\0'));
    }
    assert!(!event.id.trim().is_empty());
    assert!(event.payload.is_object());
    let again = Envelope::from_slice(&event.to_json()).expect("its own JSON parses");
    assert_eq!(again, event);
});
