//! Reading a figure back: its `<text>` elements and their attributes.
#![allow(dead_code)]

/// Every `<text>` element: its attributes (with their leading space) and its text, unescaped.
pub fn texts(svg: &str) -> Vec<(String, String)> {
    svg.split("<text")
        .skip(1)
        .filter_map(|rest| {
            let (attrs, rest) = rest.split_once('>')?;
            let (text, _) = rest.split_once("</text>")?;
            let text = text
                .replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&amp;", "&");
            Some((attrs.to_owned(), text))
        })
        .collect()
}

/// The value of attribute `name` in a tag's attributes (or a whole tag).
pub fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let at = tag.find(&key)? + key.len();
    tag[at..].split('"').next()
}
