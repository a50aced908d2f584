//! Helpers the simulator's test files share.

use flowstack_sim::calib::preset;
use flowstack_sim::Calibration;

/// The shipped `vm` preset.
pub fn vm() -> Calibration {
    Calibration::from_json(preset("vm").unwrap()).unwrap()
}

/// A file of `presets/vm-inputs`, the runs `vm` was fitted to.
#[allow(dead_code)]
pub fn input(name: &str) -> String {
    let p = format!(
        "{}/../../presets/vm-inputs/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}
