//! Figures for the benchmarks' reports: SVG drawn with plotters.

use anyhow::Result;

/// One bar: its group on the x axis, its series (colour), and the values of its runs
/// (drawn at their mean, with a whisker from the lowest to the highest).
pub struct Bar<'a> {
    pub group: &'a str,
    pub series: &'a str,
    pub values: &'a [f64],
}

/// Bars from `(group, series, values)` rows.
pub fn bars<G: AsRef<str>, S: AsRef<str>>(rows: &[(G, S, Vec<f64>)]) -> Vec<Bar<'_>> {
    rows.iter()
        .map(|(g, s, v)| Bar {
            group: g.as_ref(),
            series: s.as_ref(),
            values: v,
        })
        .collect()
}

/// Draws grouped bars into an SVG file at `path`: a group per distinct `group` (in order
/// of first appearance), a bar per series within it, a legend of the series.
pub fn grouped_bars(path: &std::path::Path, title: &str, y_desc: &str, rows: &[Bar]) -> Result<()> {
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let mut params: Vec<&str> = Vec::new();
    let mut modes: Vec<&str> = Vec::new();
    for r in rows {
        if !params.contains(&r.group) {
            params.push(r.group);
        }
        if !modes.contains(&r.series) {
            modes.push(r.series);
        }
    }
    let top = rows
        .iter()
        .flat_map(|r| r.values.iter().copied())
        .fold(0.0f64, f64::max)
        .max(1e-9)
        * 1.1;
    let width = (160 + params.len() * (40 + 28 * modes.len())).max(480) as u32;
    let root = SVGBackend::new(path, (width, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let n = params.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..n, 0f64..top)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc(y_desc)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    // Each group's name under the middle of its bars, placed in pixels: the axis's own
    // labels fall on round numbers, not on the groups' middles.
    for (i, p) in params.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64 + 0.5, 0.0));
        root.draw(&Text::new(
            p.to_string(),
            (x, y + 10),
            TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Center, VPos::Top)),
        ))
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    // One row per parameter (rate, batch): one centred bar each.
    let single = params.len() == rows.len();
    let w = if single {
        0.8
    } else {
        0.8 / modes.len() as f64
    };
    for (k, m) in modes.iter().enumerate() {
        let slot = if single { 0.0 } else { k as f64 };
        let color = Palette99::pick(k).to_rgba();
        let bars: Vec<(f64, &Bar)> = rows
            .iter()
            .filter(|r| r.series == *m)
            .map(|r| {
                let i = params.iter().position(|p| *p == r.group).unwrap_or(0) as f64;
                (i + 0.1 + slot * w, r)
            })
            .collect();
        chart
            .draw_series(bars.iter().map(|(x, r)| {
                let mean = r.values.iter().sum::<f64>() / r.values.len().max(1) as f64;
                Rectangle::new([(*x, 0.0), (*x + w * 0.9, mean)], color.filled())
            }))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label(m.to_string())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled()));
        chart
            .draw_series(bars.iter().map(|(x, r)| {
                let lo = r.values.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = r.values.iter().copied().fold(0.0, f64::max);
                let c = *x + w * 0.45;
                PathElement::new(vec![(c, lo), (c, hi)], BLACK.stroke_width(2))
            }))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two groups of two series: an SVG with the title, the axis name, both series in the
    /// legend, both groups on the axis; one series alone draws too; no bars draws a frame.
    #[test]
    fn grouped_bars_draw_an_svg() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f.svg");
        let v = [1.0, 3.0];
        let bars = [
            Bar {
                group: "g1",
                series: "alpha",
                values: &v,
            },
            Bar {
                group: "g1",
                series: "beta",
                values: &v,
            },
            Bar {
                group: "g2",
                series: "alpha",
                values: &v,
            },
            Bar {
                group: "g2",
                series: "beta",
                values: &v[..1],
            },
        ];
        grouped_bars(&p, "the title", "units", &bars).unwrap();
        let svg = std::fs::read_to_string(&p).unwrap();
        for s in ["<svg", "the title", "units", "alpha", "beta", "g1", "g2"] {
            assert!(svg.contains(s), "{s}");
        }
        grouped_bars(&p, "one", "u", &bars[..1]).unwrap();
        grouped_bars(&p, "none", "u", &[]).unwrap();
        assert!(std::fs::read_to_string(&p).unwrap().contains("none"));
    }
}
