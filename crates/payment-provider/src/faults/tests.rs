//! The faults' JSON form and how each is drawn.

use super::*;
use serde_json::json;

#[test]
fn a_rate_hits_that_share_of_the_calls_evenly() {
    let faults = Faults::new(Some(Fault {
        kind: Kind::LoseResponse,
        when: When::Rate(0.25),
        endpoint: Endpoint::Charges,
    }));
    let hits: Vec<bool> = (0..12)
        .map(|_| faults.draw(Endpoint::Charges).is_some())
        .collect();
    let expected = [false, false, false, true].repeat(3);
    assert_eq!(hits, expected);
}

#[test]
fn a_count_hits_the_next_calls_then_disarms() {
    let faults = Faults::new(Some(
        Fault::parse(r#"{"kind": "unavailable", "next": 2}"#).unwrap(),
    ));
    assert_eq!(faults.draw(Endpoint::Charges), Some(Kind::Unavailable));
    assert_eq!(faults.draw(Endpoint::Charges), Some(Kind::Unavailable));
    assert_eq!(faults.draw(Endpoint::Charges), None);
    assert_eq!(faults.armed(Endpoint::Charges), None);
}

#[test]
fn the_json_form_round_trips_and_its_mistakes_are_named() {
    for text in [
        r#"{"kind":"slow","delay_ms":3000,"next":2}"#,
        r#"{"kind":"lose-response","rate":0.33}"#,
        r#"{"kind":"unavailable","rate":1.0}"#,
        r#"{"kind":"commit-late","delay_ms":1500,"rate":0.5}"#,
        r#"{"kind":"refuse","code":"insufficient_funds","next":3}"#,
        r#"{"kind":"list-lag","lag_ms":2000,"rate":0.5}"#,
    ] {
        let fault = Fault::parse(text).unwrap();
        assert_eq!(Fault::from_json(fault.to_json()).unwrap(), fault, "{text}");
    }
    for (text, says) in [
        (r#"{"kind":"slow"}"#, "delay_ms"),
        (r#"{"kind":"unavailable","delay_ms":5}"#, "delay_ms"),
        (r#"{"kind":"commit-late"}"#, "delay_ms"),
        (r#"{"kind":"lose-response","delay_ms":5}"#, "delay_ms"),
        (
            r#"{"kind":"refuse","delay_ms":5,"endpoint":"refunds"}"#,
            "delay_ms",
        ),
        (r#"{"kind":"slow","delay_ms":5,"code":"x"}"#, "code"),
        (r#"{"kind":"refuse","endpoint":"charges"}"#, "endpoint"),
        (r#"{"kind":"refuse","code":""}"#, "code"),
        (r#"{"kind":"refuse","code":"Disputed!"}"#, "code"),
        (
            r#"{"kind":"refuse","code":"charge_already_refunded"}"#,
            "charge_already_refunded",
        ),
        (r#"{"kind":"list-lag"}"#, "lag_ms"),
        (r#"{"kind":"list-lag","delay_ms":5}"#, "delay_ms"),
        (r#"{"kind":"slow","delay_ms":5,"lag_ms":5}"#, "lag_ms"),
        (
            r#"{"kind":"list-lag","lag_ms":5,"endpoint":"charges"}"#,
            "endpoint",
        ),
        (r#"{"kind":"unavailable","endpoint":"list"}"#, "endpoint"),
        (r#"{"kind":"refuse","endpoint":"list"}"#, "endpoint"),
        (r#"{"kind":"unavailable","rate":0.5,"next":1}"#, "not both"),
        (r#"{"kind":"unavailable","rate":1.5}"#, "rate"),
        (r#"{"kind":"unavailable","next":0}"#, "next"),
        (r#"{"kind":"explode"}"#, "explode"),
        (r#"{"kind":"unavailable","often":1}"#, "often"),
        (r#"{"kind":"unavailable","endpoint":"payouts"}"#, "payouts"),
        ("lose-response", "not JSON"),
    ] {
        let error = Fault::parse(text).unwrap_err();
        assert!(error.contains(says), "{text}: {error}");
    }
    assert_eq!(
        Fault::from_json(json!({"kind": "lose-response"}))
            .unwrap()
            .when,
        When::Rate(1.0)
    );
}

#[test]
fn a_commit_late_fault_holds_the_commit_of_charges_or_refunds() {
    for endpoint in [Endpoint::Charges, Endpoint::Refunds] {
        let fault = Fault::from_json(json!({
            "kind": "commit-late", "delay_ms": 2500, "next": 1, "endpoint": endpoint,
        }))
        .unwrap();
        assert_eq!(fault.kind, Kind::CommitLate(Duration::from_millis(2500)));
        assert_eq!(fault.endpoint, endpoint);
        assert_eq!(
            fault.to_json(),
            json!({"kind": "commit-late", "delay_ms": 2500, "next": 1})
        );
        let faults = Faults::new(Some(fault.clone()));
        assert_eq!(faults.draw(endpoint), Some(fault.kind));
        assert_eq!(faults.draw(endpoint), None);
    }
}

#[test]
fn a_refuse_fault_is_the_refunds_and_says_its_code() {
    let fault = Fault::parse(r#"{"kind":"refuse","endpoint":"refunds"}"#).unwrap();
    assert_eq!(fault.kind, Kind::Refuse(CHARGE_DISPUTED.into()));
    assert_eq!(fault.endpoint, Endpoint::Refunds);
    assert_eq!(
        fault.to_json(),
        json!({"kind": "refuse", "code": "charge_disputed", "rate": 1.0})
    );
    assert_eq!(
        Fault::parse(r#"{"kind":"refuse"}"#).unwrap(),
        fault,
        "a refuse fault goes on refunds without naming them"
    );
    let error = Fault::parse(r#"{"kind":"refuse","endpoint":"charges"}"#).unwrap_err();
    assert!(error.starts_with("endpoint \"charges\""), "{error}");

    let faults = Faults::new(Some(
        Fault::parse(r#"{"kind":"refuse","code":"balance_insufficient","next":1}"#).unwrap(),
    ));
    assert_eq!(faults.draw(Endpoint::Charges), None);
    assert_eq!(
        faults.draw(Endpoint::Refunds),
        Some(Kind::Refuse("balance_insufficient".into()))
    );
    assert_eq!(faults.draw(Endpoint::Refunds), None);
}

#[test]
fn a_list_lag_fault_is_the_lists_alone_and_draws_like_the_others() {
    let fault = Fault::parse(r#"{"kind":"list-lag","lag_ms":1500,"rate":0.5}"#).unwrap();
    assert_eq!(fault.kind, Kind::ListLag(Duration::from_millis(1500)));
    assert_eq!(fault.endpoint, Endpoint::List);
    assert_eq!(
        Fault::parse(r#"{"kind":"list-lag","lag_ms":1500,"rate":0.5,"endpoint":"list"}"#).unwrap(),
        fault
    );
    assert_eq!(Endpoint::parse("list"), Ok(Endpoint::List));

    let faults = Faults::new(Some(fault));
    let drawn: Vec<bool> = (0..4)
        .map(|_| faults.draw(Endpoint::List).is_some())
        .collect();
    assert_eq!(drawn, [false, true, false, true]);
    assert_eq!(faults.draw(Endpoint::Charges), None);
    assert_eq!(faults.draw(Endpoint::Refunds), None);
    let shown = faults.to_json();
    assert_eq!(
        shown["faults"]["list"],
        json!({"kind": "list-lag", "lag_ms": 1500, "rate": 0.5})
    );
    assert_eq!(shown["fault"], Value::Null);
    faults.disarm(Endpoint::List);
    assert_eq!(faults.to_json()["faults"]["list"], Value::Null);
}

#[test]
fn a_fault_is_for_charges_unless_it_names_refunds() {
    let parse = |text| Fault::parse(text).unwrap().endpoint;
    assert_eq!(parse(r#"{"kind":"unavailable"}"#), Endpoint::Charges);
    assert_eq!(
        parse(r#"{"kind":"unavailable","endpoint":"charges"}"#),
        Endpoint::Charges
    );
    assert_eq!(
        parse(r#"{"kind":"lose-response","next":1,"endpoint":"refunds"}"#),
        Endpoint::Refunds
    );
    let refunds = Fault::parse(r#"{"kind":"slow","delay_ms":5,"endpoint":"refunds"}"#).unwrap();
    let mut shown = refunds.to_json();
    assert_eq!(shown.get("endpoint"), None, "{shown}");
    shown["endpoint"] = "refunds".into();
    assert_eq!(Fault::from_json(shown).unwrap(), refunds);
}

#[test]
fn each_endpoint_draws_its_own_fault_alone() {
    let faults = Faults::new(Some(
        Fault::parse(r#"{"kind":"lose-response","next":2,"endpoint":"refunds"}"#).unwrap(),
    ));
    assert_eq!(faults.draw(Endpoint::Charges), None);
    assert_eq!(faults.draw(Endpoint::Refunds), Some(Kind::LoseResponse));
    faults.arm(Fault::parse(r#"{"kind":"unavailable","next":1}"#).unwrap());
    assert_eq!(
        faults.armed(Endpoint::Refunds).map(|fault| fault.when),
        Some(When::Next(1)),
        "arming charges leaves the refunds' fault, and its count, as it was"
    );
    assert_eq!(faults.draw(Endpoint::Charges), Some(Kind::Unavailable));
    assert_eq!(faults.draw(Endpoint::Charges), None);
    assert_eq!(faults.draw(Endpoint::Refunds), Some(Kind::LoseResponse));
    assert_eq!(faults.draw(Endpoint::Refunds), None);

    faults.arm(Fault::parse(r#"{"kind":"unavailable"}"#).unwrap());
    faults.arm(Fault::parse(r#"{"kind":"unavailable","endpoint":"refunds"}"#).unwrap());
    faults.disarm(Endpoint::Refunds);
    assert_eq!(faults.draw(Endpoint::Refunds), None);
    assert_eq!(faults.draw(Endpoint::Charges), Some(Kind::Unavailable));
    let shown = faults.to_json();
    assert_eq!(shown["fault"], json!({"kind": "unavailable", "rate": 1.0}));
    assert_eq!(shown["faults"]["charges"], shown["fault"]);
    assert_eq!(shown["faults"]["refunds"], Value::Null);
}
