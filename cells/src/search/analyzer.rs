//! How message text becomes search terms. Two analyzers, picked per tenant
//! by its language setting:
//!
//! - `standard`: words of Latin (and other alphabetic) scripts, lower-cased
//!   and folded to ASCII (`Café` matches `cafe`); runs of Chinese, Japanese
//!   or Korean characters as overlapping bigrams, so any substring of two
//!   or more characters is found (a phrase of bigrams) without a
//!   dictionary.
//! - `zh`: the same, with Chinese (Han) runs cut into words by jieba, whose
//!   dictionary ships inside the crate.
//!
//! The same analyzer reads the query, so a query is cut as the text was.

use std::sync::{Arc, LazyLock};

use serde::{Deserialize, Serialize};
use tantivy::tokenizer::{
    AsciiFoldingFilter, LowerCaser, RemoveLongFilter, TextAnalyzer, Token, TokenStream, Tokenizer,
};

/// The analyzer a tenant's messages are indexed with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    /// Alphabetic words folded; CJK as bigrams.
    #[default]
    Standard,
    /// Chinese words by jieba; other scripts as `standard`.
    Zh,
}

impl Language {
    /// The name the analyzer is registered under in an index.
    pub fn tokenizer_name(self) -> &'static str {
        match self {
            Language::Standard => "cm_standard",
            Language::Zh => "cm_zh",
        }
    }

    /// The language whose analyzer is registered as `name`.
    pub fn of_tokenizer(name: &str) -> Option<Language> {
        [Language::Standard, Language::Zh]
            .into_iter()
            .find(|l| l.tokenizer_name() == name)
    }

    pub fn analyzer(self) -> TextAnalyzer {
        TextAnalyzer::builder(Splitter {
            zh: self == Language::Zh,
        })
        .filter(RemoveLongFilter::limit(64))
        .filter(LowerCaser)
        .filter(AsciiFoldingFilter)
        .build()
    }
}

static JIEBA: LazyLock<Arc<jieba_rs::Jieba>> = LazyLock::new(|| Arc::new(jieba_rs::Jieba::new()));

/// Splits text into words, CJK bigrams and (with `zh`) jieba words.
#[derive(Clone)]
struct Splitter {
    zh: bool,
}

/// The kind of a character for splitting.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Word,
    Han,
    /// Kana, Hangul and other CJK characters that are not Han.
    OtherCjk,
    Break,
}

fn class(c: char) -> Class {
    match c as u32 {
        0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0x20000..=0x2FA1F => Class::Han,
        0x3040..=0x30FF | 0x31F0..=0x31FF | 0xAC00..=0xD7AF | 0x1100..=0x11FF | 0xFF66..=0xFF9F => {
            Class::OtherCjk
        }
        _ if c.is_alphanumeric() => Class::Word,
        _ => Class::Break,
    }
}

impl Tokenizer for Splitter {
    type TokenStream<'a> = Tokens;

    fn token_stream<'a>(&'a mut self, text: &'a str) -> Tokens {
        let mut out = Vec::new();
        let mut chars = text.char_indices().peekable();
        while let Some(&(start, c)) = chars.peek() {
            let kind = class(c);
            let mut end = start;
            // A run of one class; Han and other CJK form one CJK run.
            let same = |k: Class| {
                k == kind
                    || (kind != Class::Word
                        && kind != Class::Break
                        && k != Class::Word
                        && k != Class::Break)
            };
            while let Some(&(i, c)) = chars.peek() {
                if !same(class(c)) {
                    break;
                }
                end = i + c.len_utf8();
                chars.next();
            }
            let run = &text[start..end];
            match kind {
                Class::Break => {}
                Class::Word => push(&mut out, start, run),
                Class::Han if self.zh && run.chars().all(|c| class(c) == Class::Han) => {
                    for w in JIEBA.cut(run, true) {
                        push(&mut out, start + w.byte_start, w.word);
                    }
                }
                Class::Han | Class::OtherCjk => bigrams(&mut out, start, run),
            }
        }
        Tokens {
            tokens: out,
            at: None,
        }
    }
}

fn push(out: &mut Vec<Token>, offset: usize, word: &str) {
    let position = out.len();
    out.push(Token {
        offset_from: offset,
        offset_to: offset + word.len(),
        position,
        text: word.to_string(),
        position_length: 1,
    });
}

/// Overlapping pairs of characters; a run of one character is itself.
fn bigrams(out: &mut Vec<Token>, offset: usize, run: &str) {
    let starts: Vec<usize> = run
        .char_indices()
        .map(|(i, _)| i)
        .chain([run.len()])
        .collect();
    if starts.len() == 2 {
        push(out, offset, run);
        return;
    }
    for w in starts.windows(3) {
        push(out, offset + w[0], &run[w[0]..w[2]]);
    }
}

/// The tokens of one text, handed out in order.
pub struct Tokens {
    tokens: Vec<Token>,
    at: Option<usize>,
}

impl TokenStream for Tokens {
    fn advance(&mut self) -> bool {
        let next = self.at.map_or(0, |i| i + 1);
        self.at = Some(next);
        next < self.tokens.len()
    }
    fn token(&self) -> &Token {
        &self.tokens[self.at.unwrap_or(0)]
    }
    fn token_mut(&mut self) -> &mut Token {
        &mut self.tokens[self.at.unwrap_or(0)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms(language: Language, text: &str) -> Vec<String> {
        let mut analyzer = language.analyzer();
        let mut stream = analyzer.token_stream(text);
        let mut out = Vec::new();
        while stream.advance() {
            out.push(stream.token().text.clone());
        }
        out
    }

    #[test]
    fn latin_words_are_lower_cased_and_folded() {
        assert_eq!(
            terms(Language::Standard, "Café au LAIT, naïve!"),
            ["cafe", "au", "lait", "naive"]
        );
    }

    #[test]
    fn cjk_runs_become_bigrams_beside_words() {
        assert_eq!(
            terms(Language::Standard, "Q3 会议纪要"),
            ["q3", "会议", "议纪", "纪要"]
        );
        assert_eq!(terms(Language::Standard, "東京で"), ["東京", "京で"]);
        assert_eq!(terms(Language::Standard, "中"), ["中"]);
    }

    #[test]
    fn chinese_is_cut_into_words_by_jieba() {
        let t = terms(Language::Zh, "我们明天开会讨论预算");
        assert!(t.contains(&"明天".to_string()), "{t:?}");
        assert!(t.contains(&"预算".to_string()), "{t:?}");
        assert!(!t.contains(&"天开".to_string()), "{t:?}");
    }
}
