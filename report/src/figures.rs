//! Line charts (one line per run over steps) as SVG and PNG, drawn with plotters. Text uses the
//! bundled DejaVu Sans, so a picture is the same on every machine.

use std::sync::Once;

use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::ReportError;

/// Pixels of a chart.
const SIZE: (u32, u32) = (720, 420);

/// One line of a chart.
pub struct Line {
    /// The legend's text.
    pub label: String,
    /// The run's place among the report's runs: it picks the colour, so that a run keeps its
    /// colour in a chart where another run has no line.
    pub series: usize,
    /// (step, value) points, by step.
    pub points: Vec<(u64, f64)>,
}

/// A chart: a title, the y axis's name and its lines.
pub struct Chart {
    /// The file stem (`validation_accuracy`).
    pub name: &'static str,
    /// The title.
    pub title: String,
    /// The y axis's description.
    pub y_label: String,
    /// One line per run.
    pub lines: Vec<Line>,
}

/// The same picture in both formats.
pub struct Rendered {
    /// SVG text.
    pub svg: String,
    /// PNG bytes.
    pub png: Vec<u8>,
}

fn register_font() {
    static FONT: Once = Once::new();
    FONT.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../fonts/DejaVuSans.ttf");
        // The bundled file is a valid TrueType font; a failure here would be a build defect.
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .unwrap_or_else(|_| panic!("the bundled DejaVu Sans is not a valid font"));
    });
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn draw<DB: DrawingBackend>(chart: &Chart, root: DrawingArea<DB, plotters::coord::Shift>) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let error = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| error(&e))?;
    let points = chart.lines.iter().flat_map(|l| l.points.iter());
    let (mut x_max, mut y_min, mut y_max) = (1u64, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in points {
        x_max = x_max.max(x);
        y_min = y_min.min(y);
        y_max = y_max.max(y);
    }
    if !y_min.is_finite() {
        (y_min, y_max) = (0.0, 1.0);
    }
    let pad = ((y_max - y_min) * 0.08).max(0.01);
    let (y_low, y_high) = (if y_min >= 0.0 { (y_min - pad).max(0.0) } else { y_min - pad }, y_max + pad);
    let mut plot = ChartBuilder::on(&root)
        .caption(&chart.title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..x_max + 1, y_low..y_high)
        .map_err(|e| error(&e))?;
    plot.configure_mesh()
        .x_desc("step")
        .y_desc(chart.y_label.as_str())
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(|e| error(&e))?;
    for line in &chart.lines {
        let color = COLORS[line.series % COLORS.len()];
        plot.draw_series(LineSeries::new(line.points.iter().copied(), color.stroke_width(2)).point_size(3))
            .map_err(|e| error(&e))?
            .label(line.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    if !chart.lines.is_empty() {
        plot.configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(|e| error(&e))?;
    }
    root.present().map_err(|e| error(&e))?;
    Ok(())
}

/// Renders `chart` as SVG and as PNG.
pub fn render(chart: &Chart) -> Result<Rendered, ReportError> {
    register_font();
    let failed = |e: String| ReportError::Figure { name: chart.name.to_string(), reason: e };
    let mut svg = String::new();
    draw(chart, SVGBackend::with_string(&mut svg, SIZE).into_drawing_area()).map_err(failed)?;
    let mut pixels = vec![0u8; (SIZE.0 * SIZE.1 * 3) as usize];
    draw(chart, BitMapBackend::with_buffer(&mut pixels, SIZE).into_drawing_area()).map_err(failed)?;
    let mut png_bytes = Vec::new();
    let mut encoder = png::Encoder::new(&mut png_bytes, SIZE.0, SIZE.1);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(|e| failed(e.to_string()))?;
    writer.write_image_data(&pixels).map_err(|e| failed(e.to_string()))?;
    writer.finish().map_err(|e| failed(e.to_string()))?;
    Ok(Rendered { svg, png: png_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(color: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", color.0, color.1, color.2)
    }

    /// A run keeps its colour in a chart where the runs before it have no line (the bank's
    /// chart has no line for `ssp`, the first run).
    #[test]
    fn a_line_takes_the_colour_of_its_run_not_of_its_place_in_the_chart() {
        let chart = Chart {
            name: "active_skills",
            title: "skills".into(),
            y_label: "skills".into(),
            lines: vec![Line { label: "sesa".into(), series: 1, points: vec![(1, 16.0), (2, 18.0)] }],
        };
        let svg = render(&chart).unwrap().svg.to_uppercase();
        assert!(svg.contains(&hex(COLORS[1])), "the second run's colour is missing");
        assert!(!svg.contains(&hex(COLORS[0])), "the first run's colour drew another run's line");
    }
}
