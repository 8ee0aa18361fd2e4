//! Finishing a grammar inside the output's token budget.
//!
//! A small model held to a JSON schema often runs on (a string that repeats, an array that
//! grows) until `max_tokens` cuts it, and a cut JSON value parses as nothing. So a guide keeps
//! track of how many tokens it would take to finish from where it is, writing the shortest
//! things the grammar allows (close what is open; `1`, `""`, `null` for a value), and once the
//! budget left is about that many, it writes them in the model's place. The output is then
//! complete under the grammar (so valid under the schema), and reported as cut at the budget.
//!
//! The writer is deterministic, so the count it gives is the count it will use. The count is
//! made every [`EVERY`] tokens, and nearer the end after half the tokens to spare; closing
//! starts where the model's next token could leave too little, were the count to grow by the
//! most it grew between two counts so far (a model nesting arrays without end adds a few tokens
//! of finish with each token it writes; one that starts another item of an array adds the
//! item's least at once).

use llguidance::Matcher;
use llguidance::toktrie::TokEnv;

/// What the closer writes outside a string, best first where the grammar allows more than
/// one: the end of what is open, then a separator (allowed only after a whole value, where it
/// goes on to what the container still needs, not a longer number), then the shortest values.
/// Any other printable ASCII character follows (a pattern's letter, a minimum's digit), then the
/// openers `{` and `[`, then a space. Inside a string the order is another (`Closer::new`).
const PREFERRED: &[&str] = &[
    "}", "]", ",", ":", "\"", "1", "0", "null", "true", "false", "[]", "{}",
];

/// The longest finish counted: past it, a guide counts as if the closer could not finish.
const MAX_COUNT: usize = 1024;

/// Tokens between two counts of what finishing takes.
const EVERY: usize = 16;

/// The longest wait after counts that could not finish.
const MAX_WAIT: usize = 128;

/// Tokens kept in hand past the projected count, with a quarter of the count (see
/// [`Finish::counted`]).
const MARGIN: usize = 8;

/// Where a guide stands with its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    /// The model writes. `last`: the budget left at the last count and the count (`None` where
    /// the closer could not finish); `peak`: the most the count grew from one count to the next
    /// (a model that starts another item of an array adds the item's least at once); `wait`:
    /// tokens from the last count to the next (see [`Finish::counted`]; doubled after each
    /// count that could not finish, which costs the most and tells the least).
    Open {
        last: Option<(usize, Option<usize>)>,
        peak: usize,
        wait: usize,
    },
    /// The closer writes.
    Closing,
    /// The closer finished the grammar.
    Closed,
}

impl Finish {
    pub(crate) const START: Finish = Finish::Open {
        last: None,
        peak: 0,
        wait: EVERY,
    };

    /// Whether a count is due with `budget` tokens left.
    pub(crate) fn due(self, budget: usize) -> bool {
        match self {
            Finish::Open { last: None, .. } => true,
            Finish::Open {
                last: Some((at, _)),
                wait,
                ..
            } => budget + wait <= at,
            Finish::Closing | Finish::Closed => false,
        }
    }

    /// Takes a count (`need` tokens to finish, `budget` left): closing starts where the model's
    /// next token could leave too little, were the count to grow by its peak, with a margin
    /// held to a quarter of the budget (so a short answer is still the model's). The peak is
    /// not held: it is what a model that starts another item needs, and an answer that would
    /// have ended in time inside it is closed early (its values cut, `length`) rather than a
    /// longer one cut off. Otherwise the next count comes after half the tokens to spare,
    /// [`EVERY`] at most.
    pub(crate) fn counted(&mut self, budget: usize, need: Option<usize>) {
        let Finish::Open { last, peak, wait } = *self else {
            return;
        };
        let Some(need) = need else {
            *self = Finish::Open {
                last: Some((budget, None)),
                peak,
                wait: (wait * 2).min(MAX_WAIT),
            };
            return;
        };
        let grew = match last {
            Some((_, Some(was))) => need.saturating_sub(was),
            _ => 0,
        };
        let peak = peak.max(grew);
        let threshold = need + peak + (MARGIN + need / 4).min(budget / 4) + 1;
        *self = if budget <= threshold {
            Finish::Closing
        } else {
            Finish::Open {
                last: Some((budget, Some(need))),
                peak,
                wait: ((budget - threshold) / 2).clamp(1, EVERY),
            }
        };
    }
}

/// Where the output so far ends, for the closer's choices: inside a JSON string or not (where
/// `}` is text, not an end), read from the bytes written (for a grammar that is not JSON it
/// only orders the choices), and which candidates came too often to be written again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scan {
    in_string: bool,
    escaped: bool,
    /// The last token and how many times in a row it came.
    last: Option<u32>,
    run: usize,
    /// Inside a string, how many times each candidate came in it (by its place in
    /// [`Closer::outside`]).
    uses: [u8; 128],
    /// Candidates (bits by their place) not to write again until the output enters or leaves
    /// a string: inside one, each that came [`USE_LIMIT`] times in it (a pattern that takes
    /// `.` and `/` without end, `[a-z./]+@…`, would take them for ever); outside, each that
    /// came [`USE_LIMIT`] times in a row (a number's `0`s), but for `}` and `]`, which close.
    banned: u128,
}

/// See [`Scan::banned`].
const USE_LIMIT: usize = 4;

impl Default for Scan {
    fn default() -> Self {
        Self {
            in_string: false,
            escaped: false,
            last: None,
            run: 0,
            uses: [0; 128],
            banned: 0,
        }
    }
}

impl Scan {
    fn follow(&mut self, bytes: &[u8]) {
        for &b in bytes {
            match (self.in_string, self.escaped, b) {
                (true, true, _) => self.escaped = false,
                (true, false, b'\\') => self.escaped = true,
                (_, false, b'"') => {
                    self.in_string = !self.in_string;
                    self.banned = 0;
                    self.uses = [0; 128];
                }
                _ => {}
            }
        }
    }
}

/// The tokens a guide finishes its grammar with, for one vocabulary.
pub(crate) struct Closer {
    /// Candidates outside a string, best first: the tokens whose bytes are exactly
    /// [`PREFERRED`]'s strings, then the other printable ASCII characters.
    outside: Vec<u32>,
    /// Inside a string: the single characters, the quote first, each with its place in
    /// `outside`.
    inside: Vec<(u32, usize)>,
    eos: u32,
    /// The vocabulary's token trie: each token's bytes, what [`Scan`] reads and the
    /// fallback's measure (where no candidate is allowed, the longest allowed token: a forced
    /// key, an enum's value).
    env: TokEnv,
}

impl std::fmt::Debug for Closer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Closer")
            .field("candidates", &self.outside.len())
            .field("eos", &self.eos)
            .finish_non_exhaustive()
    }
}

impl Closer {
    /// The closer of the vocabulary `env`, whose end of sequence is `eos`.
    pub(crate) fn new(env: TokEnv, eos: u32) -> Self {
        let trie = env.tok_trie();
        // What opens more to finish comes last: an object before an array (recursion through
        // an array of itself, as in a union of types, is the commoner).
        let singles: Vec<String> = (b'!'..=b'~')
            .filter(|b| !b"{[".contains(b))
            .chain(*b"{[ ")
            .map(|b| char::from(b).to_string())
            .collect();
        let mut outside = Vec::new();
        for text in PREFERRED
            .iter()
            .copied()
            .chain(singles.iter().map(String::as_str))
        {
            if let Some(id) = trie.token_id(text.as_bytes())
                && !outside.contains(&id)
            {
                outside.push(id);
            }
        }
        // Inside a string: its end, then what formats need to go on (`@` of an email, `.` and
        // `:` of hosts and URIs), then letters and digits, then the other single characters.
        let rank = |id: u32| match trie.token(id) {
            b"\"" => 0,
            [b'@' | b'.' | b'-' | b':' | b'/'] => 1,
            [b] if b.is_ascii_alphanumeric() => 2,
            [_] => 3,
            _ => 4,
        };
        let mut inside: Vec<(u32, usize)> = (outside.iter().copied().zip(0..))
            .filter(|&(id, _)| rank(id) < 4)
            .collect();
        inside.sort_by_key(|&(id, _)| rank(id));
        Self {
            outside,
            inside,
            eos,
            env,
        }
    }

    /// Token `id`'s bytes (none for a special token or padding).
    fn bytes(&self, id: u32) -> &[u8] {
        let trie = self.env.tok_trie();
        if trie.is_special_token(id) {
            &[]
        } else {
            trie.token(id)
        }
    }

    /// `scan` past token `id`.
    pub(crate) fn follow(&self, scan: &mut Scan, id: u32) {
        let bytes = self.bytes(id);
        let was_in_string = scan.in_string;
        scan.follow(bytes);
        scan.run = if scan.last == Some(id) {
            scan.run + 1
        } else {
            1
        };
        scan.last = Some(id);
        let Some(place) = self
            .outside
            .iter()
            .position(|&c| c == id)
            .filter(|&p| p < 128)
        else {
            return;
        };
        let ban = if was_in_string && scan.in_string {
            scan.uses[place] = scan.uses[place].saturating_add(1);
            usize::from(scan.uses[place]) >= USE_LIMIT
        } else {
            scan.run >= USE_LIMIT && bytes != b"}" && bytes != b"]"
        };
        if ban {
            scan.banned |= 1 << place;
        }
    }

    /// The token the closer writes where `allowed` says which are: the end of sequence where
    /// the grammar may end, else the best candidate, else the longest allowed token (`mask`,
    /// the whole mask, is only read then).
    fn choose(
        &self,
        scan: Scan,
        mut allowed: impl FnMut(u32) -> bool,
        mask: impl FnOnce() -> Option<Vec<u32>>,
    ) -> Option<u32> {
        if allowed(self.eos) {
            return Some(self.eos);
        }
        let open = |place: usize| place > 127 || scan.banned >> place & 1 == 0;
        let found = if scan.in_string {
            (self.inside.iter().copied()).find(|&(id, place)| open(place) && allowed(id))
        } else {
            (self.outside.iter().copied().zip(0..)).find(|&(id, place)| open(place) && allowed(id))
        };
        if let Some((id, _)) = found {
            return Some(id);
        }
        let mask = mask()?;
        let mut best: Option<(u32, usize)> = None;
        for (w, &word) in mask.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let id = (w * 32) as u32 + bits.trailing_zeros();
                bits &= bits - 1;
                let len = self.bytes(id).len();
                if len > 0 && best.is_none_or(|(_, l)| len > l) {
                    best = Some((id, len));
                }
            }
        }
        best.map(|(id, _)| id)
    }

    /// Narrows `mask` (what the grammar allows now at `matcher`'s place) to the one token the
    /// closer writes: the first of the text the grammar forces, if any (as the count takes
    /// it), else its choice. A mask that allows nothing stays as it is (the caller reports it).
    pub(crate) fn narrow(&self, matcher: &mut Matcher, scan: Scan, mask: &mut [u32]) {
        let bit = |mask: &[u32], id: u32| {
            (mask.get(id as usize / 32)).is_some_and(|w| w >> (id % 32) & 1 == 1)
        };
        let forced = matcher.compute_ff_tokens().first().copied();
        let pick = forced
            .filter(|&id| bit(mask, id))
            .or_else(|| self.choose(scan, |id| bit(mask, id), || Some(mask.to_vec())));
        if let Some(id) = pick {
            mask.fill(0);
            mask[id as usize / 32] |= 1 << (id % 32);
        }
    }

    /// How many tokens the closer would take to finish `matcher`'s grammar from where it is;
    /// `None` where it cannot within `budget` (nor [`MAX_COUNT`]): it repeats itself, the
    /// grammar only grows, or what is left is too little. Closing would not help then.
    pub(crate) fn tokens_to_finish(
        &self,
        matcher: &Matcher,
        mut scan: Scan,
        budget: usize,
    ) -> Option<usize> {
        // A clone follows the closer's tokens; the sequence's own matcher is not touched.
        let mut m = matcher.clone();
        let mut n = 0;
        while n < budget.min(MAX_COUNT) {
            if m.is_stopped() {
                return (!m.is_error()).then_some(n);
            }
            // Text the grammar forces (a key, an enum's only value) is written in the tokens
            // llguidance forces for it, as `narrow` writes it: count those, not single bytes.
            let forced = m.compute_ff_tokens();
            if !forced.is_empty() {
                m.consume_tokens(&forced).ok()?;
                forced.iter().for_each(|&id| self.follow(&mut scan, id));
                n += forced.len();
                continue;
            }
            let mut valid = |id: u32| {
                if id == self.eos {
                    m.is_accepting().unwrap_or(false)
                } else {
                    m.validate_tokens(&[id]).is_ok_and(|k| k == 1)
                }
            };
            let pick = self.choose(scan, &mut valid, || None).or_else(|| {
                let vob = m.compute_mask().ok()?;
                self.choose(scan, |_| false, || Some(vob.as_slice().to_vec()))
            });
            n += 1;
            match pick {
                Some(id) if id == self.eos => return Some(n),
                Some(id) if m.consume_token(id).is_ok() => self.follow(&mut scan, id),
                _ => return None,
            }
        }
        None
    }
}
