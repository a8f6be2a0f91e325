//! XML property lists as macOS tools print them (`hdiutil ... -plist`), read into a tree.
//!
//! Owns: the subset of the plist format its tools write: `dict`, `array`, `key`, `string`,
//! `integer`, `real`, `date`, `data`, `true`, `false`, empty elements (`<string/>`), the five
//! named entities and numeric character references, comments, the XML declaration and the
//! DOCTYPE. Pure: compiled and tested on every system. Must never: panic or recurse without
//! bound on any input (nesting is limited to `MAX_DEPTH`); what it cannot read is an error.

use anyhow::{bail, Context, Result};

/// Deepest nesting of dicts and arrays read.
const MAX_DEPTH: usize = 32;

/// One value of a property list.
#[derive(Debug, Clone, PartialEq)]
pub enum Plist {
    Dict(Vec<(String, Plist)>),
    Array(Vec<Plist>),
    String(String),
    Bool(bool),
    /// `integer`, `real`, `date` and `data`: their text as written.
    Scalar(String),
}

impl Plist {
    /// The value of `key` in a dict.
    pub fn get(&self, key: &str) -> Option<&Plist> {
        match self {
            Plist::Dict(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Plist::String(text) => Some(text),
            _ => None,
        }
    }

    pub fn as_array(&self) -> &[Plist] {
        match self {
            Plist::Array(items) => items,
            _ => &[],
        }
    }
}

/// Parses a document: an optional XML declaration, DOCTYPE and comments, then one
/// `<plist>` element holding one value. Text before the XML declaration (a tool's notice on
/// the same stream) is skipped.
pub fn parse(text: &str) -> Result<Plist> {
    let start = text
        .find("<?xml")
        .or_else(|| text.find("<plist"))
        .context("no property list in the output")?;
    let mut reader = Reader {
        text: &text[start..],
        at: 0,
    };
    reader.skip_prolog()?;
    let (name, empty) = reader.open_tag()?;
    if name != "plist" || empty {
        bail!("expected <plist>, found <{name}>");
    }
    let value = reader.value(0)?;
    reader.close_tag("plist")?;
    reader.skip_misc()?;
    if reader.at != reader.text.len() {
        bail!("text after </plist>");
    }
    Ok(value)
}

struct Reader<'a> {
    text: &'a str,
    at: usize,
}

impl Reader<'_> {
    fn rest(&self) -> &str {
        &self.text[self.at..]
    }

    fn skip_whitespace(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start().len();
    }

    /// Skips past the next `end` (which must come).
    fn skip_past(&mut self, end: &str) -> Result<()> {
        let found = self
            .rest()
            .find(end)
            .with_context(|| format!("unterminated markup: no {end:?}"))?;
        self.at += found + end.len();
        Ok(())
    }

    /// Whitespace and comments.
    fn skip_misc(&mut self) -> Result<()> {
        loop {
            self.skip_whitespace();
            if self.rest().starts_with("<!--") {
                self.skip_past("-->")?;
            } else {
                return Ok(());
            }
        }
    }

    /// The XML declaration, DOCTYPE (no internal subset) and comments before the root.
    fn skip_prolog(&mut self) -> Result<()> {
        loop {
            self.skip_misc()?;
            if self.rest().starts_with("<?") {
                self.skip_past("?>")?;
            } else if self.rest().starts_with("<!DOCTYPE") {
                self.skip_past(">")?;
            } else {
                return Ok(());
            }
        }
    }

    /// `<name attributes...>` or `<name/>`: the name, and whether it was empty.
    fn open_tag(&mut self) -> Result<(String, bool)> {
        self.skip_misc()?;
        let rest = self.rest();
        if !rest.starts_with('<') || rest.starts_with("</") {
            bail!("expected an element at byte {}", self.at);
        }
        let end = rest.find('>').context("unterminated tag")?;
        let inside = &rest[1..end];
        let (inside, empty) = match inside.strip_suffix('/') {
            Some(stripped) => (stripped, true),
            None => (inside, false),
        };
        let name = inside.split_whitespace().next().unwrap_or_default();
        if name.is_empty() {
            bail!("a tag without a name at byte {}", self.at);
        }
        let name = name.to_string();
        self.at += end + 1;
        Ok((name, empty))
    }

    fn close_tag(&mut self, name: &str) -> Result<()> {
        self.skip_misc()?;
        let tag = format!("</{name}");
        if !self.rest().starts_with(&tag) {
            bail!("expected </{name}> at byte {}", self.at);
        }
        self.at += tag.len();
        self.skip_whitespace();
        if !self.rest().starts_with('>') {
            bail!("unterminated </{name}>");
        }
        self.at += 1;
        Ok(())
    }

    /// The character data up to the next tag, entities resolved.
    fn text_content(&mut self) -> Result<String> {
        let end = self.rest().find('<').context("unterminated text")?;
        let text = unescape(&self.rest()[..end])?;
        self.at += end;
        Ok(text)
    }

    fn value(&mut self, depth: usize) -> Result<Plist> {
        if depth > MAX_DEPTH {
            bail!("nested deeper than {MAX_DEPTH}");
        }
        let (name, empty) = self.open_tag()?;
        match (name.as_str(), empty) {
            ("true", true) => Ok(Plist::Bool(true)),
            ("false", true) => Ok(Plist::Bool(false)),
            ("dict", true) => Ok(Plist::Dict(Vec::new())),
            ("array", true) => Ok(Plist::Array(Vec::new())),
            ("string", true) => Ok(Plist::String(String::new())),
            ("integer" | "real" | "date" | "data", true) => Ok(Plist::Scalar(String::new())),
            ("dict", false) => self.dict(depth),
            ("array", false) => self.array(depth),
            ("string", false) => {
                let text = self.text_content()?;
                self.close_tag("string")?;
                Ok(Plist::String(text))
            }
            (kind @ ("integer" | "real" | "date" | "data"), false) => {
                let text = self.text_content()?;
                self.close_tag(kind)?;
                Ok(Plist::Scalar(text.trim().to_string()))
            }
            (other, _) => bail!("unexpected element <{other}>"),
        }
    }

    fn at_close(&mut self, name: &str) -> Result<bool> {
        self.skip_misc()?;
        Ok(self.rest().starts_with(&format!("</{name}")))
    }

    fn dict(&mut self, depth: usize) -> Result<Plist> {
        let mut entries = Vec::new();
        while !self.at_close("dict")? {
            let (name, empty) = self.open_tag()?;
            let key = match (name.as_str(), empty) {
                ("key", true) => String::new(),
                ("key", false) => {
                    let key = self.text_content()?;
                    self.close_tag("key")?;
                    key
                }
                (other, _) => bail!("expected <key> in a dict, found <{other}>"),
            };
            let value = self.value(depth + 1)?;
            entries.push((key, value));
        }
        self.close_tag("dict")?;
        Ok(Plist::Dict(entries))
    }

    fn array(&mut self, depth: usize) -> Result<Plist> {
        let mut items = Vec::new();
        while !self.at_close("array")? {
            items.push(self.value(depth + 1)?);
        }
        self.close_tag("array")?;
        Ok(Plist::Array(items))
    }
}

/// Character data with `&amp;`, `&lt;`, `&gt;`, `&quot;`, `&apos;`, `&#N;` and `&#xH;` resolved.
fn unescape(raw: &str) -> Result<String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        let semi = after.find(';').context("an unterminated entity")?;
        let entity = &after[..semi];
        let ch = match entity {
            "amp" => '&',
            "lt" => '<',
            "gt" => '>',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(hex) = entity.strip_prefix("#x") {
                    u32::from_str_radix(hex, 16).ok()
                } else if let Some(decimal) = entity.strip_prefix('#') {
                    decimal.parse().ok()
                } else {
                    None
                };
                code.and_then(char::from_u32)
                    .with_context(|| format!("unknown entity &{entity};"))?
            }
        };
        out.push(ch);
        rest = &after[semi + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_document_with_every_kind_of_value_reads_back() {
        let doc = r#"notice on stdout
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- a comment -->
<plist version="1.0">
<dict>
	<key>name</key>
	<string>a &amp; b &lt;c&gt; &#233;&#x41;</string>
	<key>empty</key><string/>
	<key>n</key><integer> 42 </integer>
	<key>yes</key><true/>
	<key>no</key><false/>
	<key>list</key>
	<array>
		<dict/>
		<array/>
		<data>AA==</data>
	</array>
</dict>
</plist>
"#;
        let value = parse(doc).unwrap();
        assert_eq!(value.get("name").unwrap().as_str(), Some("a & b <c> éA"));
        assert_eq!(value.get("empty").unwrap().as_str(), Some(""));
        assert_eq!(value.get("n"), Some(&Plist::Scalar("42".into())));
        assert_eq!(value.get("yes"), Some(&Plist::Bool(true)));
        assert_eq!(value.get("no"), Some(&Plist::Bool(false)));
        let list = value.get("list").unwrap().as_array();
        assert_eq!(list.len(), 3);
        assert_eq!(list[0], Plist::Dict(Vec::new()));
        assert_eq!(list[2], Plist::Scalar("AA==".into()));
        assert_eq!(value.get("missing"), None);
    }

    #[test]
    fn what_is_not_a_property_list_is_an_error_never_a_panic() {
        let deep = format!(
            "<plist>{}{}</plist>",
            "<array>".repeat(100),
            "</array>".repeat(100)
        );
        for bad in [
            "",
            "hdiutil: attach failed - Read-only file system",
            "<plist>",
            "<plist><dict><key>a</key></dict></plist>",
            "<plist><dict><string>a</string></dict></plist>",
            "<plist><string>a</plist>",
            "<plist><string>&bogus;</string></plist>",
            "<plist><string>&#xD800;</string></plist>",
            "<plist><unknown/></plist>",
            "<plist><true/></plist> trailing",
            "<plist><dict><key>a",
            "<plist></>",
            deep.as_str(),
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        // Every prefix of a good document: an error or a value, never a panic.
        let good = r#"<?xml version="1.0"?><plist version="1.0"><dict><key>k</key><array><string>v&amp;</string><true/></array></dict></plist>"#;
        for end in 0..good.len() {
            let _ = parse(&good[..end]);
        }
        assert!(parse(good).is_ok());
    }
}
