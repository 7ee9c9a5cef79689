// Glue between the page and the ipywidgets HTML manager, loaded after require.js and
// before embed-amd.js on pages that contain widgets.
(function () {
  "use strict";

  // 1. The bundled modules ("@jupyter-widgets/controls", ".../html-manager/dist/libembed-amd",
  //    ...) load their icon fonts from the folder that RequireJS gives for their module id,
  //    which by default is relative to the page's own folder. Point those module paths at the
  //    copy served next to this script, where the fonts are.
  var here = document.currentScript.src.replace(/[?#].*$/, "").replace(/\/[^\/]*$/, "");
  var dist = here + "/html-manager/dist";
  window.require.config({
    paths: {
      "@jupyter-widgets/html-manager/dist": dist,
      "@jupyter-widgets": dist,
    },
  });

  // 2. The widget views typeset their labels with MathJax 2's `MathJax.Hub.Queue`. The book
  //    loads MathJax 3, which has no `Hub`; give it one that forwards to MathJax 3. MathJax is
  //    loaded with `defer`, so it exists by DOMContentLoaded, and the widgets are only drawn
  //    at the window's load event, which comes after.
  function typeset(element) {
    var mj = window.MathJax;
    if (!element || !mj || !mj.startup || !mj.startup.promise) {
      return;
    }
    mj.startup.promise
      .then(function () {
        return mj.typesetPromise ? mj.typesetPromise([element]) : null;
      })
      .catch(function (err) {
        console.warn("MathJax could not typeset a widget label:", err);
      });
  }

  function addHub() {
    var mj = window.MathJax;
    if (!mj || mj.Hub) {
      return;
    }
    mj.Hub = {
      // Each queued item looks like ["Typeset", MathJax.Hub, element].
      Queue: function () {
        for (var i = 0; i < arguments.length; i++) {
          var item = arguments[i];
          if (Array.isArray(item) && item[0] === "Typeset") {
            typeset(item[2]);
          }
        }
      },
    };
  }

  document.addEventListener("DOMContentLoaded", addHub);
})();
