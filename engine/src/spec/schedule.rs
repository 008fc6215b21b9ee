//! When a stage runs.

use std::fmt;

use serde_yaml::Value;

/// When a stage runs. Steps count from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// On every step.
    EveryStep,
    /// On step 1 only.
    Once,
    /// On the last step only.
    AtEnd,
    /// On steps k, 2k, 3k, ...
    Every(u64),
}

impl Schedule {
    /// Reads `every_step`, `once`, `at_end` or `{every: k}`.
    pub(crate) fn from_yaml(value: &Value) -> Result<Schedule, String> {
        const EXPECTED: &str = "expected `every_step`, `once`, `at_end` or `{every: k}` with k >= 1";
        match value {
            Value::String(name) => match name.as_str() {
                "every_step" => Ok(Schedule::EveryStep),
                "once" => Ok(Schedule::Once),
                "at_end" => Ok(Schedule::AtEnd),
                other => Err(format!("unknown schedule `{other}`; {EXPECTED}")),
            },
            Value::Mapping(map) if map.len() == 1 => match map.get("every").and_then(Value::as_u64) {
                Some(k) if k >= 1 => Ok(Schedule::Every(k)),
                _ => Err(EXPECTED.to_string()),
            },
            _ => Err(EXPECTED.to_string()),
        }
    }

    /// Whether the stage runs at `step` of a run of `steps` steps.
    pub fn fires(self, step: u64, steps: u64) -> bool {
        match self {
            Schedule::EveryStep => true,
            Schedule::Once => step == 1,
            Schedule::AtEnd => step == steps,
            Schedule::Every(k) => step.is_multiple_of(k),
        }
    }

    /// The last step before `step` at which the stage ran, if any.
    pub fn last_fire_before(self, step: u64, steps: u64) -> Option<u64> {
        (1..step).rev().find(|&earlier| self.fires(earlier, steps))
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::EveryStep => write!(f, "every step"),
            Schedule::Once => write!(f, "once"),
            Schedule::AtEnd => write!(f, "at end"),
            Schedule::Every(k) => write!(f, "every {k} steps"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Schedule;

    #[test]
    fn schedules_fire_on_the_documented_steps() {
        let fired = |schedule: Schedule| (1..=6).filter(|&s| schedule.fires(s, 6)).collect::<Vec<_>>();
        assert_eq!(fired(Schedule::EveryStep), vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(fired(Schedule::Once), vec![1]);
        assert_eq!(fired(Schedule::AtEnd), vec![6]);
        assert_eq!(fired(Schedule::Every(2)), vec![2, 4, 6]);
        assert_eq!(Schedule::Every(2).last_fire_before(5, 6), Some(4));
        assert_eq!(Schedule::Once.last_fire_before(1, 6), None);
        assert_eq!(Schedule::Once.last_fire_before(3, 6), Some(1));
    }

    #[test]
    fn schedule_parse_errors_say_what_is_allowed() {
        let parse = |text: &str| Schedule::from_yaml(&serde_yaml::from_str(text).unwrap());
        assert_eq!(parse("once"), Ok(Schedule::Once));
        assert_eq!(parse("{every: 10}"), Ok(Schedule::Every(10)));
        insta::assert_snapshot!(parse("{every: 0}").unwrap_err(), @"expected `every_step`, `once`, `at_end` or `{every: k}` with k >= 1");
        insta::assert_snapshot!(parse("weekly").unwrap_err(), @"unknown schedule `weekly`; expected `every_step`, `once`, `at_end` or `{every: k}` with k >= 1");
    }
}
