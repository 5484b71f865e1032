//! Two consumers applying events for the same order at the same moment, as a redelivery
//! racing the original, or a rebalance, can make them.

use saga::{Applier, Envelope, Handler};

/// Applies `first` with `a` and `second` with `b` at once and returns their outcomes,
/// sorted, as either may win.
pub async fn outcomes<H: Handler>(
    (a, first): (&Applier<H>, &Envelope),
    (b, second): (&Applier<H>, &Envelope),
) -> [&'static str; 2] {
    let (x, y) = tokio::join!(a.apply(first), b.apply(second));
    let mut outcomes = [x.unwrap().as_str(), y.unwrap().as_str()];
    outcomes.sort();
    outcomes
}
