//! The view's state (grouping, sort, filter) and what each key does to it.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::{
    columns::{Column, SORT_ORDER},
    model::By,
};

/// What a key asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Quit,
    /// Process rows <-> endpoint rows (from pools: process rows).
    ToggleBy,
    /// The pool view, or back to process rows.
    Pools,
    /// Sort by the next (or previous) column.
    SortNext,
    SortPrev,
    Reverse,
    /// `/`: start typing a filter.
    FilterStart,
    FilterChar(char),
    FilterBackspace,
    /// Enter: keep the filter typed.
    FilterDone,
    /// Esc: clear the filter.
    FilterClear,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ui {
    pub by: By,
    pub sort: Column,
    /// Smallest (or for names, last) first.
    pub reverse: bool,
    pub filter: String,
    /// The filter is being typed: keys are text.
    pub editing: bool,
    pub quit: bool,
}

impl Ui {
    pub fn new(by: By, sort: Column, reverse: bool, filter: String) -> Self {
        Self {
            by,
            sort,
            reverse,
            filter,
            editing: false,
            quit: false,
        }
    }

    /// The action of a key press (None: the key does nothing here).
    pub fn action(&self, key: KeyEvent) -> Option<Action> {
        // Key releases and repeats come on terminals that report them.
        if key.kind != KeyEventKind::Press {
            return None;
        }
        // Raw mode: Ctrl-C is a key, not a signal.
        if key.modifiers.contains(KeyModifiers::CONTROL) {
            return matches!(key.code, KeyCode::Char('c' | 'd')).then_some(Action::Quit);
        }
        if self.editing {
            return match key.code {
                KeyCode::Enter => Some(Action::FilterDone),
                KeyCode::Esc => Some(Action::FilterClear),
                KeyCode::Backspace => Some(Action::FilterBackspace),
                KeyCode::Char(c) => Some(Action::FilterChar(c)),
                _ => None,
            };
        }
        match key.code {
            KeyCode::Char('q') => Some(Action::Quit),
            KeyCode::Esc => Some(Action::FilterClear),
            KeyCode::Char('e' | 'p') | KeyCode::Tab => Some(Action::ToggleBy),
            KeyCode::Char('o') => Some(Action::Pools),
            KeyCode::Char('>' | '.') | KeyCode::Right => Some(Action::SortNext),
            KeyCode::Char('<' | ',') | KeyCode::Left => Some(Action::SortPrev),
            KeyCode::Char('r') => Some(Action::Reverse),
            KeyCode::Char('/') => Some(Action::FilterStart),
            _ => None,
        }
    }

    pub fn apply(&mut self, a: Action) {
        match a {
            Action::Quit => self.quit = true,
            Action::ToggleBy => {
                self.by = match self.by {
                    By::Process => By::Endpoint,
                    By::Endpoint | By::Pool => By::Process,
                }
            }
            Action::Pools => {
                self.by = if self.by == By::Pool {
                    By::Process
                } else {
                    By::Pool
                }
            }
            Action::SortNext | Action::SortPrev => {
                let i = SORT_ORDER.iter().position(|c| *c == self.sort).unwrap_or(0);
                let n = SORT_ORDER.len();
                let next = if a == Action::SortNext {
                    i + 1
                } else {
                    i + n - 1
                };
                self.sort = SORT_ORDER[next % n];
                // By endpoint, COMM is the endpoint again: skip it.
                if self.sort == Column::Comm && self.by == By::Endpoint {
                    self.apply(a);
                }
            }
            Action::Reverse => self.reverse = !self.reverse,
            Action::FilterStart => self.editing = true,
            Action::FilterChar(c) => self.filter.push(c),
            Action::FilterBackspace => {
                self.filter.pop();
            }
            Action::FilterDone => self.editing = false,
            Action::FilterClear => {
                self.filter.clear();
                self.editing = false;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn press(ui: &mut Ui, code: KeyCode) {
        press_with(ui, code, KeyModifiers::NONE);
    }

    fn press_with(ui: &mut Ui, code: KeyCode, m: KeyModifiers) {
        if let Some(a) = ui.action(KeyEvent::new(code, m)) {
            ui.apply(a);
        }
    }

    fn ui() -> Ui {
        Ui::new(By::Process, Column::Rate, false, String::new())
    }

    #[test]
    fn keys_switch_sort_and_reverse() {
        let mut u = ui();
        press(&mut u, KeyCode::Char('o'));
        assert_eq!(u.by, By::Pool);
        press(&mut u, KeyCode::Char('o'));
        assert_eq!(u.by, By::Process);
        press(&mut u, KeyCode::Char('e'));
        assert_eq!(u.by, By::Endpoint);
        press(&mut u, KeyCode::Tab);
        assert_eq!(u.by, By::Process);
        press(&mut u, KeyCode::Char('>'));
        assert_eq!(u.sort, Column::Requests);
        press(&mut u, KeyCode::Char('<'));
        press(&mut u, KeyCode::Char('<'));
        assert_eq!(u.sort, Column::Comm);
        press(&mut u, KeyCode::Char('<'));
        press(&mut u, KeyCode::Char('<'));
        assert_eq!(u.sort, Column::Gpu, "wraps around");
        press(&mut u, KeyCode::Char('r'));
        assert!(u.reverse);
        let mut u = Ui::new(By::Endpoint, Column::Key, false, String::new());
        press(&mut u, KeyCode::Right);
        assert_eq!(u.sort, Column::Rate, "no COMM by endpoint");
        press(&mut u, KeyCode::Left);
        assert_eq!(u.sort, Column::Key);
    }

    #[test]
    fn a_filter_is_typed_then_kept_or_cleared() {
        let mut u = ui();
        press(&mut u, KeyCode::Char('/'));
        for c in "cuqrl".chars() {
            press(&mut u, KeyCode::Char(c));
        }
        assert!(!u.quit, "q is text while typing");
        assert_eq!(u.filter, "cuqrl");
        press(&mut u, KeyCode::Backspace);
        press(&mut u, KeyCode::Backspace);
        press(&mut u, KeyCode::Backspace);
        press(&mut u, KeyCode::Char('r'));
        press(&mut u, KeyCode::Char('l'));
        press(&mut u, KeyCode::Enter);
        assert_eq!((u.filter.as_str(), u.editing), ("curl", false));
        press(&mut u, KeyCode::Esc);
        assert_eq!(u.filter, "", "Esc clears a kept filter first");
        assert!(!u.quit);
        press(&mut u, KeyCode::Char('/'));
        press(&mut u, KeyCode::Char('x'));
        press(&mut u, KeyCode::Esc);
        assert_eq!((u.filter.as_str(), u.editing), ("", false));
    }

    #[test]
    fn q_and_ctrl_c_quit() {
        let mut u = ui();
        press(&mut u, KeyCode::Char('q'));
        assert!(u.quit);
        let mut u = ui();
        press(&mut u, KeyCode::Char('/'));
        press_with(&mut u, KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert!(u.quit, "even while typing a filter");
        let mut u = ui();
        press(&mut u, KeyCode::Char('x'));
        assert_eq!(u, ui(), "other keys do nothing");
    }
}
