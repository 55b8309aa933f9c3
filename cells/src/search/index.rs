//! One tenant's index: a tantivy index in its own directory, one document
//! per message keyed by (conversation, seq), so re-indexing a message
//! replaces it and a redelivered event adds nothing. Documents hold only
//! what a query filters and sorts on; the text is analyzed, not stored —
//! hits are read back from the cell's history, as `Pull` reads them.

use cellmesh_proto::ids::{ConversationId, UserId};
use std::ops::Bound;
use std::path::Path;
use std::sync::Mutex;

use tantivy::collector::TopDocs;
use tantivy::query::{
    BooleanQuery, Occur, Query, QueryParser, RangeQuery, TermQuery, TermSetQuery,
};
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, STORED, STRING, Schema, TextFieldIndexing,
    TextOptions, Value,
};
use tantivy::snippet::SnippetGenerator;
use tantivy::{
    DocAddress, Index, IndexReader, IndexWriter, Order, ReloadPolicy, TantivyDocument, Term,
};

use super::SearchError;
use super::analyzer::Language;

/// The longest snippet, in characters.
const SNIPPET_CHARS: usize = 160;

#[derive(Clone, Copy)]
struct Fields {
    key: Field,
    conversation: Field,
    seq: Field,
    msg_id: Field,
    sender: Field,
    ts: Field,
    text: Field,
}

fn schema(language: Language) -> (Schema, Fields) {
    let mut b = Schema::builder();
    let text = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(language.tokenizer_name())
            .set_index_option(IndexRecordOption::WithFreqsAndPositions),
    );
    let fields = Fields {
        key: b.add_text_field("key", STRING),
        conversation: b.add_u64_field("conversation", INDEXED | STORED),
        seq: b.add_u64_field("seq", INDEXED | STORED),
        msg_id: b.add_u64_field("msg_id", INDEXED | FAST | STORED),
        sender: b.add_u64_field("sender", INDEXED),
        ts: b.add_u64_field("ts", INDEXED),
        text: b.add_text_field("text", text),
    };
    (b.build(), fields)
}

fn key(conversation: ConversationId, seq: u64) -> String {
    format!("{conversation}/{seq}")
}

/// A message as the index holds it.
#[derive(Debug, Clone)]
pub struct IndexedMessage {
    pub conversation: ConversationId,
    pub seq: u64,
    pub msg_id: u64,
    pub sender: UserId,
    pub ts_ms: u64,
    pub text: String,
}

/// What a query asks one tenant's index.
#[derive(Debug, Clone, Default)]
pub struct Lookup<'a> {
    pub text: &'a str,
    /// Only these conversations (never empty: an empty list finds nothing).
    pub conversations: &'a [ConversationId],
    pub sender: Option<UserId>,
    /// Inclusive bounds on the server time (ms).
    pub from_ms: Option<u64>,
    pub to_ms: Option<u64>,
    /// Only messages with a smaller msg_id.
    pub before_msg_id: Option<u64>,
}

/// A matching message, newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub conversation: ConversationId,
    pub seq: u64,
    pub msg_id: u64,
}

/// A parsed lookup, to page through and to highlight with.
pub struct Prepared {
    query: Box<dyn Query>,
    snippets: SnippetGenerator,
    searcher: tantivy::Searcher,
    /// The query names terms of the text (not only exclusions).
    has_terms: bool,
}

pub struct TenantIndex {
    index: Index,
    writer: Mutex<IndexWriter>,
    reader: IndexReader,
    fields: Fields,
    pub language: Language,
}

impl TenantIndex {
    pub fn open(dir: &Path, language: Language, heap_bytes: usize) -> Result<Self, SearchError> {
        std::fs::create_dir_all(dir)?;
        let (schema, fields) = schema(language);
        let directory = tantivy::directory::MmapDirectory::open(dir)?;
        let index = Index::open_or_create(directory, schema)?;
        // An index made under another language keeps its own analyzer:
        // terms must be cut the way they were indexed.
        let stored = index.schema();
        let language = (stored.get_field("text").ok())
            .and_then(|f| match stored.get_field_entry(f).field_type() {
                tantivy::schema::FieldType::Str(o) => o
                    .get_indexing_options()
                    .and_then(|i| Language::of_tokenizer(i.tokenizer())),
                _ => None,
            })
            .unwrap_or(language);
        for l in [Language::Standard, Language::Zh] {
            index
                .tokenizers()
                .register(l.tokenizer_name(), l.analyzer());
        }
        let writer = index.writer_with_num_threads(1, heap_bytes.max(15_000_000))?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()?;
        Ok(Self {
            index,
            writer: Mutex::new(writer),
            reader,
            fields,
            language,
        })
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, IndexWriter> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `m`, replacing what the index held for its (conversation, seq).
    pub fn upsert(&self, m: &IndexedMessage) -> Result<(), SearchError> {
        let doc = self.document(m);
        let writer = self.writer();
        writer.delete_term(Term::from_field_text(
            self.fields.key,
            &key(m.conversation, m.seq),
        ));
        writer.add_document(doc)?;
        Ok(())
    }

    /// Adds `m`, which the index cannot hold yet: a message sent after
    /// every document the index may hold (see the indexer). Skipping the
    /// replace spares the delete every segment would otherwise look up.
    pub fn add_new(&self, m: &IndexedMessage) -> Result<(), SearchError> {
        let doc = self.document(m);
        self.writer().add_document(doc)?;
        Ok(())
    }

    fn document(&self, m: &IndexedMessage) -> TantivyDocument {
        let f = self.fields;
        let mut doc = TantivyDocument::default();
        doc.add_text(f.key, key(m.conversation, m.seq));
        doc.add_u64(f.conversation, m.conversation.get());
        doc.add_u64(f.seq, m.seq);
        doc.add_u64(f.msg_id, m.msg_id);
        doc.add_u64(f.sender, m.sender.get());
        doc.add_u64(f.ts, m.ts_ms);
        doc.add_text(f.text, &m.text);
        doc
    }

    /// Removes the message at (conversation, seq), if indexed.
    pub fn remove(&self, conversation: ConversationId, seq: u64) {
        let term = Term::from_field_text(self.fields.key, &key(conversation, seq));
        self.writer().delete_term(term);
    }

    /// Removes the messages of `conversation` in `seqs` (all: `None`).
    pub fn remove_history(
        &self,
        conversation: ConversationId,
        seqs: Option<(u64, u64)>,
    ) -> Result<(), SearchError> {
        let f = self.fields;
        let term = Term::from_field_u64(f.conversation, conversation.get());
        let Some((first, last)) = seqs else {
            self.writer().delete_term(term);
            return Ok(());
        };
        let range = RangeQuery::new(
            Bound::Included(Term::from_field_u64(f.seq, first)),
            Bound::Included(Term::from_field_u64(f.seq, last)),
        );
        let query = BooleanQuery::new(vec![
            (
                Occur::Must,
                Box::new(TermQuery::new(term, IndexRecordOption::Basic)) as Box<dyn Query>,
            ),
            (Occur::Must, Box::new(range)),
        ]);
        self.writer().delete_query(Box::new(query))?;
        Ok(())
    }

    /// Makes what was added durable and visible to queries.
    pub fn commit(&self) -> Result<(), SearchError> {
        self.writer().commit()?;
        self.reader.reload()?;
        Ok(())
    }

    /// Documents visible to queries (tests and metrics).
    pub fn num_docs(&self) -> u64 {
        self.reader.searcher().num_docs()
    }

    /// Parses `lookup` against this index.
    pub fn prepare(&self, lookup: &Lookup<'_>) -> Result<Prepared, SearchError> {
        let f = self.fields;
        let mut parser = QueryParser::for_index(&self.index, vec![f.text]);
        parser.set_conjunction_by_default();
        let text = parser
            .parse_query(lookup.text)
            .map_err(|e| SearchError::Query(e.to_string()))?;
        let searcher = self.reader.searcher();
        let mut has_terms = false;
        text.query_terms(&mut |term, _| has_terms |= term.field() == f.text);
        let snippets = {
            let mut g = SnippetGenerator::create(&searcher, &*text, f.text)?;
            g.set_max_num_chars(SNIPPET_CHARS);
            g
        };
        let u64_range = |field: Field, lo: Option<u64>, hi: Bound<u64>| -> Box<dyn Query> {
            let lo = lo.map_or(Bound::Unbounded, |v| {
                Bound::Included(Term::from_field_u64(field, v))
            });
            let hi = match hi {
                Bound::Included(v) => Bound::Included(Term::from_field_u64(field, v)),
                Bound::Excluded(v) => Bound::Excluded(Term::from_field_u64(field, v)),
                Bound::Unbounded => Bound::Unbounded,
            };
            Box::new(RangeQuery::new(lo, hi))
        };
        let conversations = lookup
            .conversations
            .iter()
            .map(|&c| Term::from_field_u64(f.conversation, c.get()));
        let mut clauses: Vec<(Occur, Box<dyn Query>)> = vec![
            (Occur::Must, text),
            (Occur::Must, Box::new(TermSetQuery::new(conversations))),
        ];
        if let Some(sender) = lookup.sender {
            let term = Term::from_field_u64(f.sender, sender.get());
            clauses.push((
                Occur::Must,
                Box::new(TermQuery::new(term, IndexRecordOption::Basic)),
            ));
        }
        if lookup.from_ms.is_some() || lookup.to_ms.is_some() {
            let hi = lookup.to_ms.map_or(Bound::Unbounded, Bound::Included);
            clauses.push((Occur::Must, u64_range(f.ts, lookup.from_ms, hi)));
        }
        if let Some(before) = lookup.before_msg_id {
            clauses.push((
                Occur::Must,
                u64_range(f.msg_id, None, Bound::Excluded(before)),
            ));
        }
        Ok(Prepared {
            query: Box::new(BooleanQuery::new(clauses)),
            snippets,
            searcher,
            has_terms,
        })
    }

    /// Matches `offset..offset + limit` of a prepared lookup, newest first.
    pub fn page(
        &self,
        p: &Prepared,
        offset: usize,
        limit: usize,
    ) -> Result<Vec<Candidate>, SearchError> {
        let top = TopDocs::with_limit(limit.max(1))
            .and_offset(offset)
            .order_by_fast_field::<u64>("msg_id", Order::Desc);
        let found: Vec<(Option<u64>, DocAddress)> = p.searcher.search(&*p.query, &top)?;
        let f = self.fields;
        found
            .into_iter()
            .map(|(_, address)| {
                let doc: TantivyDocument = p.searcher.doc(address)?;
                let get = |field| doc.get_first(field).and_then(|v| v.as_u64()).unwrap_or(0);
                Ok(Candidate {
                    conversation: ConversationId(get(f.conversation)),
                    seq: get(f.seq),
                    msg_id: get(f.msg_id),
                })
            })
            .collect()
    }
}

impl Prepared {
    /// Whether the query has no term to highlight (every candidate counts).
    pub fn matches_without_terms(&self) -> bool {
        !self.has_terms
    }

    /// The fragment of `text` around the match, and the matched ranges in it.
    pub fn snippet(&self, text: &str) -> (String, Vec<std::ops::Range<usize>>) {
        let s = self.snippets.snippet(text);
        let fragment = s.fragment().to_string();
        let ranges = s.highlighted().to_vec();
        if fragment.is_empty() {
            // No term of the query in the text (e.g. a phrase of one word):
            // the text's beginning.
            let end = text
                .char_indices()
                .nth(SNIPPET_CHARS)
                .map_or(text.len(), |(i, _)| i);
            return (text[..end].to_string(), Vec::new());
        }
        (fragment, ranges)
    }
}
