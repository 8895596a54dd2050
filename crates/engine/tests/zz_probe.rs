use pagefold_engine::{Config, Engine, Hint, PAGE};
#[test]
fn probe() {
    let e = Engine::new(Config::default());
    let n = 16 * PAGE;
    let a = e.alloc(n, Hint::None);
    let b = e.alloc(n, Hint::None);
    for i in 0..n { unsafe { *a.add(i) = (i % 251) as u8 + 1 }; }
    let want: Vec<u8> = (0..n).map(|i| (i % 251) as u8 + 1).collect();
    unsafe { e.copy(b, a, n) };
    eprintln!("{:?}", e.stats());
    let r = e.scan();
    eprintln!("{r:?}\n{:?}", e.stats());
    let r = e.scan();
    eprintln!("{r:?}\n{:?}", e.stats());
    let sa = unsafe { std::slice::from_raw_parts(a, n) };
    let sb = unsafe { std::slice::from_raw_parts(b, n) };
    assert!(sa == &want[..], "a differs");
    assert!(sb == &want[..], "b differs");
}
