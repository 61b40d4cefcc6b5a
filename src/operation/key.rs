//! Operation keys: one stable key per operation, whatever path named it.
//!
//! Guarantees (docs/DESIGN.md, invariant 6): the key is the last `<collection>/<id>` pair in
//! the name, with collection `batches`, `operations` or `interactions`; surrounding white
//! space and empty segments (leading, doubled or trailing slashes) are ignored; case is kept.
//! A bare id takes its collection from the event type. The full name is kept beside the key,
//! because the status API needs it (`models/{model}/operations/{id}`). Names that could steer
//! a status-API request elsewhere (`.`/`..` segments, characters outside a conservative set)
//! are refused rather than rewritten.

use thiserror::Error;

/// Longest accepted operation name, in bytes. Keeps `op:<key>` far inside KV's 512-byte key
/// limit and any name Gemini issues (they are well under 200 bytes).
pub const MAX_NAME_BYTES: usize = 400;

/// The three kinds of long-running operation Gemini reports on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collection {
    Batches,
    Operations,
    Interactions,
}

impl Collection {
    /// The collection's path segment, as Gemini spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Collection::Batches => "batches",
            Collection::Operations => "operations",
            Collection::Interactions => "interactions",
        }
    }

    /// The collection of a normalized key (`batches/x` gives batches).
    pub fn of_key(key: &str) -> Option<Self> {
        key.split('/').next().and_then(Self::from_segment)
    }

    fn from_segment(segment: &str) -> Option<Self> {
        match segment {
            "batches" => Some(Collection::Batches),
            "operations" => Some(Collection::Operations),
            "interactions" => Some(Collection::Interactions),
            _ => None,
        }
    }
}

/// A normalized operation identity: `key` for deduplication, `name` for the status API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperationKey {
    /// `<collection>/<id>`, identical from every path.
    pub key: String,
    /// The full resource name as given, trimmed, without empty segments.
    pub name: String,
    /// The collection the key lives in.
    pub collection: Collection,
}

/// Why a name cannot be turned into a key.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    #[error("name is empty")]
    Empty,
    #[error("name is longer than {MAX_NAME_BYTES} bytes")]
    TooLong,
    #[error("name contains a character outside [A-Za-z0-9-_.~:@+=]")]
    BadCharacter,
    #[error("name contains a '.' or '..' segment")]
    DotSegment,
    #[error(
        "name has no batches/, operations/ or interactions/ part and no event type to imply one"
    )]
    NoCollection,
}

fn allowed(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '~' | ':' | '@' | '+' | '=')
}

/// Normalizes `raw` into a key. `implied` is the collection an event type implies
/// (`batch.*` gives batches), used only when the name is a bare id.
pub fn normalize(raw: &str, implied: Option<Collection>) -> Result<OperationKey, KeyError> {
    let trimmed = raw.trim();
    if trimmed.len() > MAX_NAME_BYTES {
        return Err(KeyError::TooLong);
    }
    let segments: Vec<&str> = trimmed.split('/').filter(|s| !s.is_empty()).collect();
    if segments.is_empty() {
        return Err(KeyError::Empty);
    }
    for segment in &segments {
        if *segment == "." || *segment == ".." {
            return Err(KeyError::DotSegment);
        }
        if !segment.chars().all(allowed) {
            return Err(KeyError::BadCharacter);
        }
    }
    // The last collection segment that has an id after it.
    let pair = (0..segments.len().saturating_sub(1))
        .rev()
        .find_map(|i| Collection::from_segment(segments[i]).map(|c| (c, segments[i + 1])));
    let (collection, id, name) = match (pair, segments.as_slice(), implied) {
        (Some((collection, id)), _, _) => (collection, id, Some(segments.join("/"))),
        // A bare id: its name is its key.
        (None, [id], Some(collection)) if Collection::from_segment(id).is_none() => {
            (collection, *id, None)
        }
        _ => return Err(KeyError::NoCollection),
    };
    let key = format!("{}/{}", collection.as_str(), id);
    Ok(OperationKey {
        name: name.unwrap_or_else(|| key.clone()),
        key,
        collection,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(raw: &str) -> String {
        normalize(raw, None).unwrap().key
    }

    #[test]
    fn plain_batch_name_is_its_own_key() {
        assert_eq!(key("batches/abc"), "batches/abc");
        assert_eq!(normalize("batches/abc", None).unwrap().name, "batches/abc");
    }

    #[test]
    fn project_prefix_is_dropped_but_kept_in_name() {
        let k = normalize("projects/p/locations/l/batches/x", None).unwrap();
        assert_eq!(k.key, "batches/x");
        assert_eq!(k.name, "projects/p/locations/l/batches/x");
    }

    #[test]
    fn trailing_slash_and_white_space_are_ignored() {
        assert_eq!(key("batches/x/"), "batches/x");
        assert_eq!(key(" batches/x"), "batches/x");
        assert_eq!(key("/batches//x\n"), "batches/x");
    }

    #[test]
    fn video_operation_keeps_full_name_for_status_api() {
        let k = normalize("models/veo-3/operations/y", None).unwrap();
        assert_eq!(k.key, "operations/y");
        assert_eq!(k.name, "models/veo-3/operations/y");
        assert_eq!(k.collection, Collection::Operations);
    }

    #[test]
    fn collection_of_a_key() {
        assert_eq!(Collection::of_key("batches/x"), Some(Collection::Batches));
        assert_eq!(
            Collection::of_key("operations/x"),
            Some(Collection::Operations)
        );
        assert_eq!(
            Collection::of_key("interactions/x"),
            Some(Collection::Interactions)
        );
        assert_eq!(Collection::of_key("models/x"), None);
    }

    #[test]
    fn interaction_name() {
        assert_eq!(key("interactions/i-1"), "interactions/i-1");
    }

    #[test]
    fn bare_id_takes_collection_from_event_type() {
        let k = normalize("batch_123456", Some(Collection::Batches)).unwrap();
        assert_eq!(k.key, "batches/batch_123456");
        assert_eq!(k.name, "batches/batch_123456");
        assert_eq!(
            normalize("op1", Some(Collection::Operations)).unwrap().key,
            "operations/op1"
        );
        assert_eq!(
            normalize("i1", Some(Collection::Interactions)).unwrap().key,
            "interactions/i1"
        );
    }

    #[test]
    fn bare_id_without_event_type_is_refused() {
        assert_eq!(normalize("batch_1", None), Err(KeyError::NoCollection));
    }

    #[test]
    fn full_name_ignores_implied_collection() {
        let k = normalize("batches/x", Some(Collection::Interactions)).unwrap();
        assert_eq!(k.key, "batches/x");
    }

    #[test]
    fn last_pair_wins() {
        assert_eq!(key("batches/a/operations/b"), "operations/b");
        assert_eq!(key("batches/operations"), "batches/operations");
    }

    #[test]
    fn case_is_kept() {
        assert_eq!(key("batches/AbC"), "batches/AbC");
        assert_ne!(key("batches/abc"), key("batches/ABC"));
    }

    #[test]
    fn every_form_gives_the_same_key() {
        let forms = [
            "batches/x",
            "batches/x/",
            " batches/x",
            "projects/p/locations/l/batches/x",
        ];
        for form in forms {
            assert_eq!(key(form), "batches/x", "{form}");
        }
        assert_eq!(
            normalize("x", Some(Collection::Batches)).unwrap().key,
            "batches/x"
        );
    }

    #[test]
    fn refuses_empty_long_and_hostile_names() {
        assert_eq!(normalize("", None), Err(KeyError::Empty));
        assert_eq!(normalize(" / ", None), Err(KeyError::Empty));
        let long = format!("batches/{}", "a".repeat(MAX_NAME_BYTES));
        assert_eq!(normalize(&long, None), Err(KeyError::TooLong));
        assert_eq!(normalize("batches/../x", None), Err(KeyError::DotSegment));
        assert_eq!(normalize("batches/a b", None), Err(KeyError::BadCharacter));
        assert_eq!(normalize("batches/a?b", None), Err(KeyError::BadCharacter));
        assert_eq!(normalize("batches/a%2F", None), Err(KeyError::BadCharacter));
        assert_eq!(normalize("batches", None), Err(KeyError::NoCollection));
    }
}
