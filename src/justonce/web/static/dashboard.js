// justonce dashboard: refresh the live part of the page every 2 s (no reload, no library).
// The server renders the HTML (escaped there); this only swaps it in.
(function () {
  "use strict";
  var live = document.querySelector("[data-live]");
  var status = document.getElementById("live-status");
  var every = 2000;
  function tick() {
    if (!live || document.hidden) { setTimeout(tick, every); return; }
    fetch(live.getAttribute("data-live"), { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (r.status === 401 || r.redirected) { window.location = "/signin"; return null; }
        if (!r.ok) { throw new Error(String(r.status)); }
        return r.text();
      })
      .then(function (html) {
        if (html === null) { return; }
        live.innerHTML = html;
        if (status) { status.classList.remove("stale"); status.lastChild.textContent = "live"; }
      })
      .catch(function () {
        if (status) { status.classList.add("stale"); status.lastChild.textContent = "reconnecting"; }
      })
      .finally(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
  // "Are you sure?" for buttons that say so.
  document.addEventListener("submit", function (e) {
    var msg = e.target.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) { e.preventDefault(); }
  });
})();
