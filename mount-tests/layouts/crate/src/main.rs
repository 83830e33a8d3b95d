//! Built by the layout mount tests from a pkgfs mount of cargo's registry cache.
fn main() {
    let re = regex::Regex::new(r"^([a-z]+)-([0-9]+)\.([0-9]+)\.([0-9]+)$").unwrap();
    let caps = re.captures("pkgfs-1.2.3").unwrap();
    let mut buf = itoa::Buffer::new();
    let minor: u64 = caps[3].parse().unwrap();
    let v = serde_json::json!({ "name": &caps[1], "major": &caps[2], "minor": buf.format(minor + 1) });
    println!("{}", serde_json::to_string(&v).unwrap());
}
