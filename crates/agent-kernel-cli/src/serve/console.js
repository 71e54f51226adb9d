// agent-kernel console: live updates. Every page works without this script; with it, the
// page listens to /events and, on a change, fetches itself again and swaps in its <main>,
// unless a form on it is being filled in (then it says so and waits for a reload).
"use strict";
(function () {
  if (!window.EventSource || !window.fetch || !window.DOMParser) {
    return;
  }
  var status = document.getElementById("live");
  var pending = null;
  var busy = false;

  function say(text) {
    if (status) {
      status.textContent = text;
    }
  }

  // A form the operator is filling in: a focused field, or text typed into one.
  function editing() {
    var main = document.querySelector("main");
    if (!main) {
      return false;
    }
    var active = document.activeElement;
    if (active && main.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) {
      return true;
    }
    var fields = main.querySelectorAll("input[type=text], textarea");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value !== fields[i].defaultValue) {
        return true;
      }
    }
    return false;
  }

  function refresh() {
    pending = null;
    if (busy) {
      pending = setTimeout(refresh, 200);
      return;
    }
    if (editing()) {
      say("live: the page changed; reload when you are done with the form");
      return;
    }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { Accept: "text/html" } })
      .then(function (answer) {
        if (!answer.ok) {
          throw new Error("status " + answer.status);
        }
        return answer.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main");
        var main = document.querySelector("main");
        if (fresh && main && !editing()) {
          main.replaceWith(fresh);
        }
        say("live: updated " + new Date().toLocaleTimeString());
      })
      .catch(function (error) {
        say("live: cannot refresh (" + error.message + "); reload the page");
      })
      .then(function () {
        busy = false;
      });
  }

  var events = new EventSource("/events");
  events.onopen = function () {
    say("live");
  };
  events.onmessage = function () {
    // Changes come in bursts (a step and its saga): one fetch for a burst.
    if (pending === null) {
      pending = setTimeout(refresh, 150);
    }
  };
  events.onerror = function () {
    say("live: disconnected, retrying");
  };
})();
