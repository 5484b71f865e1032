//! The report's chart: throughput and latency percentiles against offered load.

use std::path::Path;

use anyhow::Context as _;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::{Report, Step};

/// A line of the chart: its label, colour, and value for a step.
type Series = (&'static str, plotters::style::RGBColor, fn(&Step) -> f64);

impl Report {
    /// Throughput and latency percentiles against offered load, side by side.
    pub fn chart(&self, path: &Path, font: &Path) -> anyhow::Result<()> {
        register_font(font)?;

        let mut steps: Vec<&Step> = self.steps.iter().collect();
        steps.sort_by(|a, b| a.offered_per_second.total_cmp(&b.offered_per_second));
        let max_x = steps
            .iter()
            .map(|s| s.offered_per_second)
            .fold(1.0, f64::max)
            * 1.1;
        let max_y = steps
            .iter()
            .flat_map(|s| {
                [
                    s.outcome.confirmed.per_second,
                    s.outcome.notified.per_second,
                    s.load.placed_per_second(),
                ]
            })
            .filter(|v| v.is_finite())
            .fold(self.ceiling_orders_per_second.max(1.0), f64::max)
            * 1.1;

        let root = BitMapBackend::new(path, (1400, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let title = format!(
            "order-saga, {} mode: {} CPUs, PostgreSQL + Kafka on the same machine",
            self.mode, self.machine.cpus
        );
        let root = root.titled(&title, ("sans-serif", 22))?;
        let (left, right) = root.split_horizontally(700);

        self.throughput(&left, &steps, max_x, max_y)?;
        latency(&right, &steps, max_x)?;
        root.present()?;
        Ok(())
    }

    /// The left panel: orders placed, confirmed and notified per second, and the
    /// ceiling.
    fn throughput(
        &self,
        left: &DrawingArea<BitMapBackend<'_>, Shift>,
        steps: &[&Step],
        max_x: f64,
        max_y: f64,
    ) -> anyhow::Result<()> {
        let mut throughput = ChartBuilder::on(left)
            .caption("Throughput (orders/s)", ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..max_x, 0.0..max_y)?;
        throughput
            .configure_mesh()
            .x_desc("offered load (orders/s)")
            .y_desc("orders/s")
            .draw()?;
        let series: [Series; 3] = [
            ("placed (POST 201)", RGBColor(120, 120, 120), |s| {
                s.load.placed_per_second()
            }),
            ("confirmed", RGBColor(31, 119, 180), |s| {
                s.outcome.confirmed.per_second
            }),
            ("notified", RGBColor(44, 160, 44), |s| {
                s.outcome.notified.per_second
            }),
        ];
        for (label, color, value) in series {
            let points: Vec<(f64, f64)> = steps
                .iter()
                .map(|s| (s.offered_per_second, value(s)))
                .filter(|(_, y)| y.is_finite())
                .collect();
            throughput
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            throughput.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
        }
        let ceiling = self.ceiling_orders_per_second;
        if ceiling.is_finite() {
            let red = RGBColor(214, 39, 40);
            throughput
                .draw_series(LineSeries::new(
                    vec![(0.0, ceiling), (max_x, ceiling)],
                    red.stroke_width(1),
                ))?
                .label("pgbench ceiling")
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], red));
        }
        throughput
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        Ok(())
    }
}

/// The chart's font, read from `font`.
fn register_font(font: &Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(font).with_context(|| {
        format!(
            "reading the chart's font {} (apt-get install fonts-dejavu-core)",
            font.display()
        )
    })?;
    // Registered once per process; plotters keeps a 'static reference.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("{} is not a usable font", font.display()))?;
    Ok(())
}

/// The right panel: POST → confirmed percentiles on a log scale.
fn latency(
    right: &DrawingArea<BitMapBackend<'_>, Shift>,
    steps: &[&Step],
    max_x: f64,
) -> anyhow::Result<()> {
    let max_latency = steps
        .iter()
        .map(|s| s.outcome.to_confirmed_ms.max)
        .filter(|v| v.is_finite())
        .fold(10.0, f64::max)
        * 1.5;
    let min_latency = steps
        .iter()
        .map(|s| s.outcome.to_confirmed_ms.p50)
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold(max_latency, f64::min)
        / 1.5;
    let mut latency = ChartBuilder::on(right)
        .caption("POST → confirmed latency (ms)", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x, (min_latency..max_latency).log_scale())?;
    latency
        .configure_mesh()
        .x_desc("offered load (orders/s)")
        .y_desc("ms (log)")
        .draw()?;
    let percentiles: [Series; 4] = [
        ("p50", RGBColor(31, 119, 180), |s| {
            s.outcome.to_confirmed_ms.p50
        }),
        ("p95", RGBColor(255, 127, 14), |s| {
            s.outcome.to_confirmed_ms.p95
        }),
        ("p99", RGBColor(214, 39, 40), |s| {
            s.outcome.to_confirmed_ms.p99
        }),
        ("max", RGBColor(120, 120, 120), |s| {
            s.outcome.to_confirmed_ms.max
        }),
    ];
    for (label, color, value) in percentiles {
        let points: Vec<(f64, f64)> = steps
            .iter()
            .map(|s| (s.offered_per_second, value(s)))
            .filter(|(_, y)| y.is_finite() && *y > 0.0)
            .collect();
        latency
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        latency.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    }
    latency
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    Ok(())
}
